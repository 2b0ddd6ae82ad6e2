package shardmap

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

// mustParse parses lines as a map with no environment.
func mustParse(t testing.TB, lines ...string) *Map {
	t.Helper()
	m, err := Parse("test.yaml", doc(lines...), testEnv)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// threeShards splits the keyspace in halves and quarters, listed out of
// order so that lookup cannot depend on file order.
func threeShards(t testing.TB) *Map {
	return mustParse(t,
		"version: 7",
		"shards:",
		`  - {name: shard-c, dsn: "host=c password=hunter2", ranges: ["c0-"]}`,
		`  - {name: shard-a, dsn: "postgres://u:hunter2@a/db", ranges: ["-80"]}`,
		`  - {name: shard-b, dsn: "host=b", ranges: ["80-c0"]}`,
	)
}

func TestShardForBoundaries(t *testing.T) {
	m := threeShards(t)
	tests := []struct {
		id    uint64
		shard string
		r     string
	}{
		{0, "shard-a", "-80"},
		{0x7fffffffffffffff, "shard-a", "-80"},
		{0x8000000000000000, "shard-b", "80-c0"},
		{0xbfffffffffffffff, "shard-b", "80-c0"},
		{0xc000000000000000, "shard-c", "c0-"},
		{math.MaxUint64, "shard-c", "c0-"},
	}
	for _, tt := range tests {
		s, r := m.ShardFor(tt.id)
		if s.Name != tt.shard || r.String() != tt.r || !r.Contains(tt.id) {
			t.Errorf("ShardFor(%016x) = %s %s, want %s %s", tt.id, s.Name, r, tt.shard, tt.r)
		}
		if s != m.Shard(tt.shard) {
			t.Errorf("ShardFor(%016x) does not point into m.Shards", tt.id)
		}
	}
	whole := mustParse(t, "version: 1", "shards:", `  - {name: only, dsn: host=h, ranges: ["-"]}`)
	for _, id := range []uint64{0, 0x8000000000000000, math.MaxUint64} {
		if s, r := whole.ShardFor(id); s.Name != "only" || r.String() != "-" {
			t.Errorf("ShardFor(%016x) on a single shard = %s %s", id, s.Name, r)
		}
	}
}

// TestRouteGolden pins account -> keyspace id -> shard for a fixed map;
// the ids are the independently computed values of TestKeyspaceIDGolden.
func TestRouteGolden(t *testing.T) {
	m := threeShards(t)
	tests := []struct {
		account int64
		line    string
	}{
		{8842, "account 8842 keyspace_id 1d65d16c18855fc7 range -80 shard shard-a"},
		{0, "account 0 keyspace_id 633457081244afec range -80 shard shard-a"},
		{1, "account 1 keyspace_id b7b41276360564d4 range 80-c0 shard shard-b"},
		{1190, "account 1190 keyspace_id 7e0ff8d468a22e60 range -80 shard shard-a"},
		{-5, "account -5 keyspace_id b46b527273306370 range 80-c0 shard shard-b"},
		{255, "account 255 keyspace_id d5ce07e01f4f0ec2 range c0- shard shard-c"},
		{math.MaxInt64, "account 9223372036854775807 keyspace_id d8afff7b1fb07eb3 range c0- shard shard-c"},
		{math.MinInt64, "account -9223372036854775808 keyspace_id 9e606ab2dd272c10 range 80-c0 shard shard-b"},
	}
	for _, tt := range tests {
		r := m.Route(tt.account)
		if got := r.String(); got != tt.line {
			t.Errorf("Route(%d) = %q, want %q", tt.account, got, tt.line)
		}
		if r.Account != tt.account || r.KeyspaceID != KeyspaceID(tt.account) {
			t.Errorf("Route(%d) = %+v", tt.account, r)
		}
	}
}

func TestOwnership(t *testing.T) {
	m := mustParse(t,
		"version: 2",
		"shards:",
		`  - {name: shard-a, dsn: host=a, ranges: ["c0-", "-40"]}`,
		`  - {name: shard-b, dsn: host=b, ranges: ["40-c0"]}`,
	)
	got := map[string][]string{}
	for name, rs := range m.Ownership() {
		for _, r := range rs {
			got[name] = append(got[name], r.String())
		}
	}
	want := map[string][]string{"shard-a": {"-40", "c0-"}, "shard-b": {"40-c0"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Ownership() = %v, want %v", got, want)
	}
}

func TestRedactedDSN(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://ledger@10.0.0.11:5432/ledger?sslmode=disable", "postgres://ledger@10.0.0.11:5432/ledger?sslmode=disable"},
		{"postgres://ledger:s3cr3t@10.0.0.11:5432/ledger", "postgres://ledger:xxxxx@10.0.0.11:5432/ledger"},
		{"postgresql://u:p%40ss@h/db?sslmode=require&password=s3cr3t", "postgresql://u:xxxxx@h/db?password=xxxxx&sslmode=require"},
		{"postgres://h/db?sslpassword=s3cr3t", "postgres://h/db?sslpassword=xxxxx"},
		{"host=h dbname=ledger", "host=h dbname=ledger"},
		{"host=h password=s3cr3t dbname=ledger", "host=h password=xxxxx dbname=ledger"},
		{"host=h password = 's3 cr\\'3t' user=u", "host=h password = xxxxx user=u"},
		{"password=s3\\ cr3t sslpassword=x", "password=xxxxx sslpassword=xxxxx"},
		{"host=h PASSWORD=s3cr3t", "host=h PASSWORD=xxxxx"},
		{"host=h password=", "host=h password=xxxxx"},
		{"host=h password='unterminated s3cr3t", "xxxxx"},
		{"postgres://u:s3cr3t@h:port/db", "xxxxx"},
		{"s3cr3t", "xxxxx"},
		{"", "xxxxx"},
	}
	for _, tt := range tests {
		if got := (Shard{DSN: tt.dsn}).RedactedDSN(); got != tt.want {
			t.Errorf("RedactedDSN(%q) = %q, want %q", tt.dsn, got, tt.want)
		}
	}
}

func TestScrub(t *testing.T) {
	tests := []struct{ dsn, text, want string }{
		// pgx's regex misses blanks around '=' and escaped quotes.
		{"host=h password = 's3 cr\\'3t' port=x", "cannot parse `host=h password = 's3 cr\\'3t' port=x`: invalid port",
			"cannot parse `host=h password = xxxxx port=x`: invalid port"},
		{"host=h password = 's3 cr\\'3t'", "auth failed for s3 cr'3t", "auth failed for xxxxx"},
		{"postgres://u:p%40ss@h/db?sslpassword=k%2Fey", "p%40ss p@ss k%2Fey k/ey", "xxxxx xxxxx xxxxx xxxxx"},
		{"host=h user=u", "host=h user=u", "host=h user=u"},
		{"s3cr3t word", "bad dsn s3cr3t", "bad dsn xxxxx"},
		// libpq's user info runs across a '?' or '#' to the '@': net/url sees no password here.
		{"postgres://h?q#y:pw%23d@z/db", "auth failed: pw%23d pw#d", "auth failed: xxxxx xxxxx"},
		{"postgres://u:pa#ss@h/db", "password pa#ss refused", "password xxxxx refused"},
	}
	for _, tt := range tests {
		if got := (Shard{DSN: tt.dsn}).Scrub(tt.text); got != tt.want {
			t.Errorf("Scrub(%q) with dsn %q = %q, want %q", tt.text, tt.dsn, got, tt.want)
		}
	}
}

// TestPrintingNeverLeaksDSN guards against a Map or Shard reaching a log
// line through fmt or JSON with its password.
func TestPrintingNeverLeaksDSN(t *testing.T) {
	m := threeShards(t)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{
		fmt.Sprintf("%v", m), fmt.Sprintf("%+v", m), fmt.Sprintf("%#v", m),
		fmt.Sprintf("%s", m.Shards), fmt.Sprint(*m.Shard("shard-a")), string(b),
	} {
		if strings.Contains(out, "hunter2") {
			t.Errorf("output leaks the password: %s", out)
		}
	}
	if got := m.Shard("shard-a").String(); got != "shard-a [-80] postgres://u:xxxxx@a/db" {
		t.Errorf("String() = %q", got)
	}
	if got := fmt.Sprintf("%#v", *m.Shard("shard-c")); got != `shardmap.Shard{Name:"shard-c", DSN:"host=c password=xxxxx", Ranges:[c0-], Line:3}` {
		t.Errorf("GoString() = %q", got)
	}
}
