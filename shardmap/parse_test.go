package shardmap

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// doc joins lines with newlines so that a test's line numbers are the
// 1-based positions in its argument list.
func doc(lines ...string) []byte {
	return []byte(strings.Join(lines, "\n") + "\n")
}

// env is a lookupEnv over fixed variables.
func env(kv ...string) func(string) (string, bool) {
	vars := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		vars[kv[i]] = kv[i+1]
	}
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

const secretDSN = "postgres://ledger:s3cr3t-pw@10.0.0.12:5432/ledger?sslmode=disable"

var testEnv = env("SHARD_B_DSN", secretDSN, "EMPTY", "", "PW", "s3cr3t-pw", "BARE_PW", "s3cr3t")

func TestParseSpecExample(t *testing.T) {
	m, err := Parse("shardmap.yaml", doc(
		"version: 7                     # strictly increasing",
		"shards:",
		"  - name: shard-a",
		"    dsn: postgres://ledger@10.0.0.11:5432/ledger?sslmode=disable   # ${VAR} is expanded",
		`    ranges: ["-80"]`,
		"  - name: shard-b",
		"    dsn: ${SHARD_B_DSN}",
		`    ranges: ["80-c0", "c0-"]`,
	), testEnv)
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != 7 || len(m.Shards) != 2 {
		t.Fatalf("got version %d with %d shards", m.Version, len(m.Shards))
	}
	a, b := m.Shards[0], m.Shards[1]
	if a.Name != "shard-a" || a.Line != 3 || a.DSN != "postgres://ledger@10.0.0.11:5432/ledger?sslmode=disable" || !equalRanges(a.Ranges, "-80") {
		t.Errorf("shard-a = %#v", a)
	}
	if b.Name != "shard-b" || b.Line != 6 || b.DSN != secretDSN || !equalRanges(b.Ranges, "80-c0", "c0-") {
		t.Errorf("shard-b = %#v", b)
	}
	if m.Shard("shard-b") != &m.Shards[1] || m.Shard("shard-x") != nil {
		t.Error("Shard lookup by name is wrong")
	}
}

func TestParseLenientForms(t *testing.T) {
	// Unquoted ranges, upper-case hex, aliases, a '$' that is not "${",
	// key=value DSNs and ranges listed out of order are all fine.
	m, err := Parse("m.yaml", doc(
		"version: 0x10",
		"shards:",
		"  - name: a",
		"    dsn: host=10.0.0.1 dbname=ledger password='pa$$ word'",
		"    ranges: &mine [C0-, -80]",
		"  - name: b0",
		"    dsn: postgresql://u:${PW}@h/db",
		"    ranges:",
		"      - 80-c0",
	), testEnv)
	if err != nil {
		t.Fatal(err)
	}
	if m.Version != 16 || !equalRanges(m.Shards[0].Ranges, "c0-", "-80") || m.Shards[1].DSN != "postgresql://u:s3cr3t-pw@h/db" {
		t.Errorf("got %#v", m)
	}
}

func equalRanges(got []KeyRange, want ...string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i].String() != want[i] {
			return false
		}
	}
	return true
}

// want is an expected problem: its line and a substring of its message.
type want struct {
	line int
	msg  string
}

func TestParseProblems(t *testing.T) {
	tests := []struct {
		name string
		src  []byte
		want []want
	}{
		{"yaml syntax", doc(
			"version: 7",
			`shards: [{name: a, ranges: ["-"]`,
			"x: 1",
		// yaml.v3 reports the line of the unclosed flow mapping's context,
		// counted from 0 for parser errors; the hint allows for that.
		), []want{{1, "invalid YAML: did not find expected ',' or '}'"}}},
		{"yaml error without line", doc(
			"version: *nope",
		), []want{{0, "invalid YAML: unknown anchor 'nope' referenced"}}},
		{"empty file", nil, []want{{0, "the file is empty"}}},
		{"comments only", doc("# nothing yet"), []want{{0, "the file is empty"}}},
		{"document without content", doc("---"), []want{{2, "the file has no content"}}},
		{"second document", doc(
			"version: 7",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
			"---",
			"version: 8",
		), []want{{4, "more than one YAML document"}}},
		{"top level not a mapping", doc("- version: 7"), []want{{1, "top level must be a mapping"}}},
		{"unknown top-level key", doc(
			"version: 7",
			"owner: payments",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
		), []want{{2, `unknown key "owner" at the top level`}}},
		{"unknown shard key", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			"    weight: 3",
			"    ranges: [-]",
		), []want{{5, `unknown key "weight" in a shard`}}},
		{"key that is not a name", doc(
			"version: 7",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
			"? [a, b]",
			": 1",
		), []want{{4, "a mapping key at the top level is not a plain name"}}},
		{"duplicate top-level key", doc(
			"version: 7",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
			"version: 8",
		), []want{{4, `duplicate key "version" at the top level (first at line 1)`}}},
		{"duplicate shard key", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			"    ranges: [-]",
			"    dsn: host=g",
		), []want{{6, `duplicate key "dsn" in a shard (first at line 4)`}}},
		{"version missing", doc(
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
		), []want{{1, "version is missing"}}},
		{"version empty", doc(
			"version:",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
		), []want{{1, "version is empty"}}},
		{"version not a number", doc(
			"version: seven",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
		), []want{{1, "version must be a whole number"}}},
		{"version not whole", doc(
			"version: 7.5",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
		), []want{{1, "version must be a whole number"}}},
		{"version quoted", doc(
			`version: "7"`,
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
		), []want{{1, "version must be a whole number"}}},
		{"version zero", doc(
			"version: 0",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
		), []want{{1, "version 0 is out of range: it must be between 1 and 9223372036854775807"}}},
		{"version beyond int64", doc(
			"version: 18446744073709551615",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
		), []want{{1, "version 18446744073709551615 is out of range"}}},
		{"shards missing", doc("version: 7"), []want{{1, "shards is missing"}}},
		{"shards empty list", doc("version: 7", "shards: []"), []want{{2, "shards is empty"}}},
		{"shards null", doc("version: 7", "shards:"), []want{{2, "shards is empty"}}},
		{"shards not a list", doc("version: 7", "shards: {name: a}"), []want{{2, "shards must be a list"}}},
		{"shard not a mapping", doc(
			"version: 7",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
			"  - shard-b",
		), []want{{4, "a shard must be a mapping"}}},
		{"name missing", doc(
			"version: 7",
			"shards:",
			"  - dsn: host=h",
			"    ranges: [-]",
		), []want{{3, "a shard has no name"}}},
		{"name empty", doc(
			"version: 7",
			"shards:",
			`  - name: ""`,
			"    dsn: host=h",
			"    ranges: [-]",
		), []want{{3, "a shard name is empty"}}},
		{"name not a string", doc(
			"version: 7",
			"shards:",
			"  - name: [a]",
			"    dsn: host=h",
			"    ranges: [-]",
		), []want{{3, "a shard name must be a string"}}},
		{"name invalid", doc(
			"version: 7",
			"shards:",
			"  - name: Shard_A",
			"    dsn: host=h",
			"    ranges: [-]",
		), []want{{3, `shard name "Shard_A" is not valid`}}},
		{"name too long", doc(
			"version: 7",
			"shards:",
			"  - name: "+strings.Repeat("a", 64),
			"    dsn: host=h",
			"    ranges: [-]",
		), []want{{3, "is not valid"}}},
		{"name duplicate", doc(
			"version: 7",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-80]}",
			"  - {name: a, dsn: host=g, ranges: [80-]}",
		), []want{{4, `duplicate shard name "a" (first at line 3)`}}},
		{"dsn missing", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    ranges: [-]",
		), []want{{3, `shard "a" has no dsn`}}},
		{"dsn empty", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn:",
			"    ranges: [-]",
		), []want{{4, `dsn of shard "a" is empty`}}},
		{"dsn not a string", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: {host: h}",
			"    ranges: [-]",
		), []want{{4, `dsn of shard "a" must be a string`}}},
		{"dsn variable unset", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: postgres://u:${DB_PASSWORD}@h/db",
			"    ranges: [-]",
		), []want{{4, `dsn of shard "a" uses ${DB_PASSWORD}, which is not set`}}},
		{"dsn variable malformed", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: ${SHARD_B_DSN",
			"    ranges: [-]",
		), []want{{4, `dsn of shard "a" contains a "${" that does not start a ${NAME} reference`}}},
		{"dsn variable empty", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: ${EMPTY}",
			"    ranges: [-]",
		), []want{{4, `dsn of shard "a" is empty after expanding environment variables`}}},
		{"dsn not a connection string", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: mysql://root@h/db",
			"    ranges: [-]",
		), []want{{4, `dsn of shard "a" is neither a postgres:// URL nor a key=value connection string`}}},
		{"dsn url invalid", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: postgres://u:pw@h:port/db",
			"    ranges: [-]",
		), []want{{4, `dsn of shard "a" is not a valid postgres:// URL`}}},
		{"dsn key=value unterminated", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			`    dsn: "host=h password='oops"`,
			"    ranges: [-]",
		), []want{{4, `the quoted value of setting 2 ("password") has no closing quote`}}},
		// The cases below once quoted a piece of the password as if it
		// were a keyword; the first was found by FuzzParse in CI.
		{"dsn is a bare password", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: ${BARE_PW}",
			"    ranges: [-]",
		), []want{{4, `setting 1 is not followed by '='`}}},
		{"dsn password with a blank", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			`    dsn: "host=h password=hunter s3cr3t"`,
			"    ranges: [-]",
		), []want{{4, `setting 3 is not followed by '='`}}},
		{"dsn password with a blank and a quote", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			`    dsn: "host=h password=hunter s3cr3t='x"`,
			"    ranges: [-]",
		), []want{{4, `the quoted value of setting 3 has no closing quote`}}},
		// Found by FuzzParse: a map whose only shard is drained once passed
		// validation with an empty index, and ShardFor panicked on it.
		{"every shard drained", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			"    ranges: []",
		), []want{{3, `keyspace - is not covered by any shard`}}},
		{"dsn known keyword without value", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			`    dsn: "host=h dbname"`,
			"    ranges: [-]",
		), []want{{4, `setting 2 ("dbname") is not followed by '='`}}},
		{"range odd length", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			`    ranges: ["-8"]`,
		), []want{{5, `shard "a": key range "-8": end: "8" has an odd number of hex digits`}}},
		{"range not hex", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			`    ranges: ["-gg"]`,
		), []want{{5, `key range "-gg": end: "gg" is not hexadecimal`}}},
		{"range start not below end", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			`    ranges: ["c0-80"]`,
		), []want{{5, `key range "c0-80": start must be below end`}}},
		{"range too long", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			`    ranges: ["-800000000000000000"]`,
		), []want{{5, "is longer than 8 bytes"}}},
		{"range without dash", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			"    ranges:",
			"      - 80",
		), []want{{6, `key range "80" must contain exactly one '-'`}}},
		{"range not a string", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			"    ranges: [[-]]",
		), []want{{5, `a range of shard "a" is not a string`}}},
		{"ranges not a list", doc(
			"version: 7",
			"shards:",
			"  - name: a",
			"    dsn: host=h",
			`    ranges: "-"`,
		), []want{{5, `ranges of shard "a" must be a list`}}},
		{"ranges missing", doc(
			"version: 7",
			"shards:",
			"  - {name: a, dsn: host=h, ranges: [-]}",
			"  - name: b",
			"    dsn: host=g",
		), []want{{4, `shard "b" has no ranges`}}},
		{"overlap", doc(
			"version: 7",
			"shards:",
			"  - name: shard-a",
			"    dsn: host=h",
			`    ranges: ["-80"]`,
			"  - name: shard-b",
			"    dsn: host=g",
			`    ranges: ["40-c0", "c0-"]`,
		), []want{{8, `overlapping ranges: "-80" of shard "shard-a" (line 5) and "40-c0" of shard "shard-b" (line 8) both own keyspace 40-80`}}},
		{"overlap with a range to the end", doc(
			"version: 7",
			"shards:",
			"  - name: shard-a",
			"    dsn: host=h",
			`    ranges: ["-80", "80-"]`,
			"  - name: shard-b",
			"    dsn: host=g",
			"    ranges:",
			`      - "c0-d0"`,
		), []want{{9, `"80-" of shard "shard-a" (line 5) and "c0-d0" of shard "shard-b" (line 9) both own keyspace c0-d0`}}},
		{"same range twice", doc(
			"version: 7",
			"shards:",
			`  - {name: a, dsn: host=h, ranges: ["-", "-"]}`,
		), []want{{3, `"-" of shard "a" (line 3) and "-" of shard "a" (line 3) both own keyspace -`}}},
		{"gap in the middle", doc(
			"version: 7",
			"shards:",
			`  - {name: shard-a, dsn: host=h, ranges: ["-80"]}`,
			`  - {name: shard-b, dsn: host=g, ranges: ["c0-"]}`,
		), []want{{4, "keyspace 80-c0 is not covered by any shard"}}},
		{"gap at the start", doc(
			"version: 7",
			"shards:",
			`  - {name: shard-a, dsn: host=h, ranges: ["40-"]}`,
		), []want{{3, "keyspace -40 is not covered by any shard"}}},
		{"gap at the end", doc(
			"version: 7",
			"shards:",
			`  - {name: shard-a, dsn: host=h, ranges: ["-80"]}`,
			`  - {name: shard-b, dsn: host=g, ranges: ["80-ff"]}`,
		), []want{{4, "keyspace ff- is not covered by any shard"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkProblems(t, tt.src, tt.want)
		})
	}
}

// checkProblems asserts that src yields exactly the wanted problems, in
// order, each with a hint.
func checkProblems(t *testing.T, src []byte, wants []want) {
	t.Helper()
	m, err := Parse("shardmap.yaml", src, testEnv)
	var verr *ValidationError
	if !errors.As(err, &verr) {
		t.Fatalf("Parse error = %v (map %v), want a *ValidationError", err, m)
	}
	if m != nil {
		t.Errorf("Parse returned a map with an error")
	}
	if verr.File != "shardmap.yaml" {
		t.Errorf("File = %q", verr.File)
	}
	if len(verr.Problems) != len(wants) {
		t.Fatalf("got %d problems, want %d:\n%v", len(verr.Problems), len(wants), err)
	}
	for i, w := range wants {
		p := verr.Problems[i]
		if p.Line != w.line || !strings.Contains(p.Msg, w.msg) {
			t.Errorf("problem %d = line %d %q, want line %d containing %q", i, p.Line, p.Msg, w.line, w.msg)
		}
		if p.Hint == "" {
			t.Errorf("problem %d (%q) has no hint", i, p.Msg)
		}
	}
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("error leaks a secret:\n%v", err)
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	checkProblems(t, doc(
		"version: 0",                     // 1
		"owner: payments",                // 2
		"shards:",                        // 3
		"  - name: shard-a",              // 4
		"    dsn: ${NOT_SET}",            // 5
		`    range: ["-40"]`,             // 6
		"  - name: Shard-B",              // 7
		"    dsn: host=h",                // 8
		`    ranges: ["40-80", "60-90"]`, // 9
		"  - name: shard-a",              // 10
		"    dsn: host=g",                // 11
		`    ranges: ["c0-"]`,            // 12
		"  - name: shard-d",              // 13
		"    dsn:",                       // 14
		`    ranges: ["9-a0"]`,           // 15
		"    ranges: []",                 // 16
	), []want{
		{1, "version 0 is out of range"},
		{2, `unknown key "owner" at the top level`},
		{4, `shard "shard-a" has no ranges`},
		{5, "uses ${NOT_SET}, which is not set"},
		{6, `unknown key "range" in a shard`},
		{7, `shard name "Shard-B" is not valid`},
		{9, `"40-80" of shard "Shard-B" (line 9) and "60-90" of shard "Shard-B" (line 9) both own keyspace 60-80`},
		{10, `duplicate shard name "shard-a" (first at line 4)`},
		{14, `dsn of shard "shard-d" is empty`},
		{15, `key range "9-a0": start: "9" has an odd number of hex digits`},
		{16, `duplicate key "ranges" in a shard (first at line 15)`},
	})
	// The typo'd key gets a suggestion.
	_, err := Parse("shardmap.yaml", doc("version: 1", "shards:", "  - {name: a, dsn: host=h, range: [-]}"), nil)
	if !strings.Contains(err.Error(), `(hint: did you mean "ranges"?`) {
		t.Errorf("no suggestion for a typo:\n%v", err)
	}
}

func TestValidationErrorFormat(t *testing.T) {
	e := &ValidationError{File: "shardmap.yaml", Problems: []Problem{
		{Line: 0, Msg: "the file is empty", Hint: "add something"},
		{Line: 12, Msg: "overlapping ranges", Hint: "shrink one"},
		{Line: 13, Msg: "no hint here"},
	}}
	want := "shardmap.yaml: the file is empty (hint: add something)\n" +
		"shardmap.yaml:12: overlapping ranges (hint: shrink one)\n" +
		"shardmap.yaml:13: no hint here"
	if e.Error() != want {
		t.Errorf("Error() =\n%s\nwant\n%s", e.Error(), want)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "shardmap.yaml")
	t.Setenv("SHARDMAP_TEST_DSN", secretDSN)
	if err := os.WriteFile(path, doc("version: 3", "shards:", `  - {name: a, dsn: "${SHARDMAP_TEST_DSN}", ranges: [-]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := Load(path)
	if err != nil || m.Version != 3 || m.Shards[0].DSN != secretDSN {
		t.Fatalf("Load = %#v, %v", m, err)
	}
	_, err = Load(filepath.Join(dir, "missing.yaml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load of a missing file: %v, want fs.ErrNotExist", err)
	}
	if err := os.WriteFile(path, doc("version: 3"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(path)
	if err == nil || !strings.HasPrefix(err.Error(), path+":1: shards is missing") {
		t.Errorf("Load of an invalid file: %v", err)
	}
}

// A shard listed with ranges: [] is being drained: it is in the map (so `shardmap apply` can
// move its rows away) but owns nothing.
func TestDrainedShardOwnsNothing(t *testing.T) {
	m, err := Parse("shardmap.yaml", []byte("version: 3\nshards:\n  - name: a\n    dsn: host=h\n    ranges: [\"-\"]\n  - name: old\n    dsn: host=g\n    ranges: []\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s := m.Shard("old"); s == nil || len(s.Ranges) != 0 {
		t.Fatalf("drained shard: %+v", s)
	}
	for _, id := range []uint64{0, 1 << 63, ^uint64(0)} {
		if s, _ := m.ShardFor(id); s.Name != "a" {
			t.Errorf("keyspace id %x routed to %s", id, s.Name)
		}
	}
	if len(m.Ownership()["old"]) != 0 {
		t.Error("drained shard owns ranges")
	}
}

// A map the router would refuse is refused by Parse, and so by `router shardmap check`: every
// DSN is parsed by the driver the router connects with. The messages never quote a password,
// even one with an escaped blank, which once left its second half in the reload error.
func TestParseRefusesWhatTheDriverRefuses(t *testing.T) {
	for _, dsn := range []string{`host=h password=Leak\\ Me995 sslmode=bogus`, `host=h password=Leak\\ Me995 connect_timeout=abc`} {
		src := "version: 1\nshards:\n  - name: a\n    dsn: \"" + dsn + "\"\n    ranges: [\"-\"]\n"
		_, err := Parse("shardmap.yaml", []byte(src), nil)
		if err == nil {
			t.Errorf("Parse accepted dsn %s", dsn)
			continue
		}
		if strings.Contains(err.Error(), "Leak") || strings.Contains(err.Error(), "Me995") {
			t.Errorf("dsn %s: error %q leaks the password", dsn, err)
		}
		if !strings.Contains(err.Error(), "shardmap.yaml:4:") {
			t.Errorf("dsn %s: error %q does not name the line", dsn, err)
		}
	}
}
