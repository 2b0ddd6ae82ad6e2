package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/partition"
)

// Requests refused before work starts get their own problem type and store nothing.
func TestBadRequestsStoreNothing(t *testing.T) {
	ledgerBefore, recsBefore := totals(t)
	long := strings.Repeat("k", 256)
	for _, tc := range []struct {
		name    string
		headers map[string]string
		body    string
		status  int
		typ     string
	}{
		{"no key", map[string]string{"Idempotency-Key": ""}, transferBody(1, 2, 3), 400, "missing-idempotency-key"},
		{"key too long", map[string]string{"Idempotency-Key": long}, transferBody(1, 2, 3), 400, "invalid-idempotency-key"},
		{"key with space", map[string]string{"Idempotency-Key": `"a b"`}, transferBody(1, 2, 3), 400, "invalid-idempotency-key"},
		{"malformed JSON", nil, `{"src": 1,`, 400, "invalid-request-body"},
		{"unknown field", nil, `{"src":1,"dst":2,"amount":3,"memo":"x"}`, 400, "invalid-request-body"},
		{"wrong type", nil, `{"src":"1","dst":2,"amount":3}`, 400, "invalid-request-body"},
		{"float amount", nil, `{"src":1,"dst":2,"amount":3.5}`, 400, "invalid-request-body"},
		{"zero amount", nil, transferBody(1, 2, 0), 400, "invalid-request-body"},
		{"src equals dst", nil, transferBody(4, 4, 3), 400, "invalid-request-body"},
		{"int64 overflow", nil, `{"src":9223372036854775808,"dst":2,"amount":3}`, 400, "invalid-request-body"},
		{"reference too long", nil, `{"src":1,"dst":2,"amount":3,"reference":"` + strings.Repeat("é", 141) + `"}`, 400, "invalid-request-body"},
		{"bad currency", nil, `{"src":1,"dst":2,"amount":3,"currency":"eur"}`, 400, "invalid-request-body"},
		{"body too large", nil, `{"src":1,"dst":2,"amount":3,"reference":"` + strings.Repeat("x", 20000) + `"}`, 413, "request-too-large"},
		{"not JSON media type", map[string]string{"Content-Type": "text/plain"}, transferBody(1, 2, 3), 415, "unsupported-media-type"},
		{"no token", map[string]string{"Authorization": ""}, transferBody(1, 2, 3), 401, "unauthorized"},
		{"wrong token", map[string]string{"Authorization": "Bearer nope"}, transferBody(1, 2, 3), 401, "unauthorized"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{"Idempotency-Key": newKey()}
			for k, v := range tc.headers {
				h[k] = v
			}
			r := do(t, http.MethodPost, "/transfers", h, tc.body)
			if r.status != tc.status || r.problemType() != tc.typ {
				t.Errorf("%d %s, want %d %s", r.status, r.body, tc.status, tc.typ)
			}
			if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
		})
	}
	if l, r := totals(t); l != ledgerBefore || r != recsBefore {
		t.Errorf("rejected requests wrote rows: ledger %d->%d, records %d->%d", ledgerBefore, l, recsBefore, r)
	}
}

// A key whose record sits in an older partition still replays, never applies again.
func TestRecordInOlderPartitionStillReplays(t *testing.T) {
	const src = 7001
	shard := shardOf(src)
	ctx := context.Background()
	yesterday := time.Now().Add(-24 * time.Hour)
	if _, err := idem.EnsurePartitions(ctx, env.pools[shard], partition.Daily, yesterday, 0); err != nil {
		t.Fatal(err)
	}
	key := newKey()
	body := transferBody(src, 7002, 900)
	first := post(t, key, body)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	// Move the record into yesterday's partition (an UPDATE of the partition key moves the row).
	tag, err := env.pools[shard].Exec(ctx, "UPDATE idempotency_record SET created_at = created_at - interval '1 day' WHERE key = $1", key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("move record: %v %v", tag, err)
	}
	var part string
	if err := env.pools[shard].QueryRow(ctx, "SELECT tableoid::regclass::text FROM idempotency_record WHERE key = $1", key).Scan(&part); err != nil {
		t.Fatal(err)
	}
	if want := partition.At(partition.Daily, yesterday).Name; part != want {
		t.Fatalf("record is in %s, want %s", part, want)
	}
	again := post(t, key, body)
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(first.body) {
		t.Errorf("retry: %d %s, want the replay", again.status, again.body)
	}
	if reused := post(t, key, transferBody(src, 7002, 901)); reused.status != http.StatusUnprocessableEntity {
		t.Errorf("different request: %d, want 422", reused.status)
	}
	if n := ledgerRows(t, shard, transferID(src, key)); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// An operator detaches today's partition by mistake. A retry of a key applied minutes ago must
// not get the final 422 idempotency-key-expired: its debit is young, so its missing record is an
// inconsistency, answered with a retryable 503 and counted; once the partition is attached
// again (the next upkeep does it), the retry replays byte for byte.
func TestDetachedPartitionIsNotExpiry(t *testing.T) {
	// The shard decides here: a router without a replay cache asks it every time.
	_, base := newRouter(t, env.mapPath, noReplayCache)
	post := func(t *testing.T, key, body string) reply { return postAt(t, base, key, body) }
	const src = 7111
	shard := shardOf(src)
	key := newKey()
	body := transferBody(src, 7112, 41)
	first := post(t, key, body)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	ctx := context.Background()
	var part string
	if err := env.pools[shard].QueryRow(ctx, "SELECT tableoid::regclass::text FROM idempotency_record WHERE key = $1", key).Scan(&part); err != nil {
		t.Fatal(err)
	}
	if _, err := env.pools[shard].Exec(ctx, "ALTER TABLE idempotency_record DETACH PARTITION "+part); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { service.Maintain(ctx, env.cfg, env.m, io.Discard) }) //nolint:errcheck // attached again below
	r := post(t, key, body)
	if r.status != http.StatusServiceUnavailable || r.problemType() != "idempotency-record-missing" || r.header.Get("Retry-After") == "" {
		t.Fatalf("retry with the record's partition detached: %d %s, want 503 idempotency-record-missing with Retry-After", r.status, r.body)
	}
	if !strings.Contains(strings.ToLower(env.logs.String()), "record missing") {
		t.Errorf("the inconsistency was not logged")
	}
	if err := service.Maintain(ctx, env.cfg, env.m, io.Discard); err != nil {
		t.Fatal(err)
	}
	again := post(t, key, body)
	if again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry with the partition back: %d %s, want the first answer replayed", again.status, again.body)
	}
	if n := ledgerRows(t, shard, transferID(src, key)); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// A key whose record was dropped by retention is never executed a second time: the ledger still
// holds its transfer id, and the answer is 422 idempotency-key-expired.
func TestExpiredRecordIsNeverReapplied(t *testing.T) {
	// The shard decides here: a router without a replay cache asks it every time.
	_, base := newRouter(t, env.mapPath, noReplayCache)
	post := func(t *testing.T, key, body string) reply { return postAt(t, base, key, body) }
	const src = 7101
	shard := shardOf(src)
	key := newKey()
	body := transferBody(src, 7102, 40)
	if r := post(t, key, body); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	// What retention does: the record is dropped, and the debit is older than retention.
	ctx := context.Background()
	if _, err := env.pools[shard].Exec(ctx, "DELETE FROM idempotency_record WHERE key = $1", key); err != nil {
		t.Fatal(err)
	}
	if _, err := env.pools[shard].Exec(ctx, "UPDATE ledger_entries SET created_at = now() - $1::interval - interval '1 hour' WHERE transfer_id = $2",
		env.cfg.Idempotency.Retention, transferID(src, key)); err != nil {
		t.Fatal(err)
	}
	r := post(t, key, body)
	if r.status != http.StatusUnprocessableEntity || r.problemType() != "idempotency-key-expired" {
		t.Errorf("retry after expiry: %d %s, want 422 idempotency-key-expired", r.status, r.body)
	}
	if n := ledgerRows(t, shard, transferID(src, key)); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	if all, _ := records(t, shard, key); all != 0 {
		t.Errorf("the refused retry stored a record")
	}
}

// A shard that is down answers 503 with Retry-After for its own accounts only, stores nothing,
// and after it returns the retries apply exactly once.
func TestShardOutageIs503AndRetriesApplyOnce(t *testing.T) {
	down := env.servers[1]
	downName, upName := "shard-1", "shard-0"
	srcDown, srcUp := accountOn(downName, 30000), accountOn(upName, 30000)
	keyDown, keyUp := newKey(), newKey()
	bodyDown, bodyUp := transferBody(srcDown, 1, 10), transferBody(srcUp, 1, 10)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := down.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := false
	defer func() {
		if !restarted {
			down.Restart(ctx) //nolint:errcheck // leave the suite a working shard
			env.pools[downName].Reset()
		}
	}()

	for i := 0; i < 3; i++ {
		r := post(t, keyDown, bodyDown)
		if r.status != http.StatusServiceUnavailable || r.problemType() != "shard-unavailable" || r.header.Get("Retry-After") != "2" {
			t.Fatalf("down shard: %d %v %s, want 503 shard-unavailable with Retry-After: 2", r.status, r.header, r.body)
		}
	}
	if r := post(t, keyUp, bodyUp); r.status != http.StatusCreated {
		t.Fatalf("healthy shard while the other is down: %d %s", r.status, r.body)
	}

	if err := down.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	restarted = true
	env.pools[downName].Reset() // the assertion pool's connections died with the server
	var first reply
	waitFor(t, func() bool {
		first = post(t, keyDown, bodyDown)
		return first.status != http.StatusServiceUnavailable
	})
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first retry after recovery: %d %s, want a fresh 201", first.status, first.body)
	}
	if r := post(t, keyDown, bodyDown); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("second retry: %d, want replay", r.status)
	}
	if n := ledgerRows(t, downName, transferID(srcDown, keyDown)); n != 1 {
		t.Errorf("%d ledger rows after recovery, want 1", n)
	}
}

// A shard that no longer owns a key range refuses it, so a router with a stale map cannot apply
// there; once ownership is granted back the transfer applies.
func TestShardRefusesRangeItDoesNotOwn(t *testing.T) {
	const src = 8842 // keyspace id 1d65d16c18855fc7, in -80
	shard := shardOf(src)
	ctx := context.Background()
	pool := env.pools[shard]
	own, err := idem.ReadOwnership(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := idem.ApplyOwnership(ctx, pool, idem.Ownership{Shard: shard, MapVersion: own.MapVersion}, idem.Grant); err != nil {
		t.Fatal(err)
	}
	key := newKey()
	r := post(t, key, transferBody(src, 1, 1))
	if err := idem.ApplyOwnership(ctx, pool, own, idem.Grant); err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusServiceUnavailable || r.problemType() != "shard-map-changing" {
		t.Errorf("unowned range: %d %s, want 503 shard-map-changing", r.status, r.body)
	}
	if all, _ := records(t, shard, key); all != 0 {
		t.Error("the refused transfer stored a record")
	}
	if r := post(t, key, transferBody(src, 1, 1)); r.status != http.StatusCreated {
		t.Errorf("after ownership returned: %d %s", r.status, r.body)
	}
	older := own
	older.MapVersion--
	if err := idem.ApplyOwnership(ctx, pool, older, idem.Grant); err == nil {
		t.Error("applying an older map version was accepted")
	}
}

func TestMetricsCountOutcomes(t *testing.T) {
	key := newKey()
	body := transferBody(9101, 9102, 5)
	post(t, key, body)
	post(t, key, body)
	r := do(t, http.MethodGet, "/metrics", nil, "")
	for _, want := range []string{
		`shardgate_transfers_total{outcome="replayed",shard="` + shardOf(9101) + `"}`,
		`shardgate_transfers_total{outcome="applied",shard="`,
		`shardgate_shard_request_duration_seconds_bucket{outcome="applied",shard="`,
		`shardgate_pool_connections{shard="shard-0",state="idle"}`,
		`shardgate_shardmap_version 1`,
	} {
		if !strings.Contains(string(r.body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// uuidV7 returns a UUIDv7 string whose timestamp is t.
func uuidV7(t time.Time) string {
	var b [16]byte
	ms := uint64(t.UnixMilli())
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	rand.Read(b[6:]) //nolint:errcheck // crypto/rand never fails
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// A UUIDv7 key older than retention is refused, never executed; one from the future is invalid;
// a current one works.
func TestUUIDv7KeyExpiry(t *testing.T) {
	ledgerBefore, recsBefore := totals(t)
	old := post(t, uuidV7(time.Now().Add(-env.cfg.Idempotency.Retention-time.Hour)), transferBody(13001, 1, 5))
	if old.status != http.StatusUnprocessableEntity || old.problemType() != "idempotency-key-expired" {
		t.Errorf("key older than retention: %d %s, want 422 idempotency-key-expired", old.status, old.body)
	}
	future := post(t, uuidV7(time.Now().Add(time.Hour)), transferBody(13001, 1, 5))
	if future.status != http.StatusBadRequest || future.problemType() != "invalid-idempotency-key" {
		t.Errorf("key from the future: %d %s, want 400 invalid-idempotency-key", future.status, future.body)
	}
	if l, r := totals(t); l != ledgerBefore || r != recsBefore {
		t.Errorf("refused keys wrote rows: ledger %d->%d, records %d->%d", ledgerBefore, l, recsBefore, r)
	}
	if r := post(t, uuidV7(time.Now().Add(-time.Hour)), transferBody(13001, 1, 5)); r.status != http.StatusCreated {
		t.Errorf("recent UUIDv7 key: %d %s, want 201", r.status, r.body)
	}
}

// /readyz wants every shard; /readyz?partial=1 is satisfied by one.
func TestReadyzWithAShardDown(t *testing.T) {
	if r := do(t, http.MethodGet, "/readyz", nil, ""); r.status != http.StatusOK {
		t.Fatalf("all shards up: %d %s", r.status, r.body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := env.servers[1].Stop(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := env.servers[1].Restart(ctx); err != nil {
			t.Error(err)
		}
		env.pools["shard-1"].Reset()
	}()
	if r := do(t, http.MethodGet, "/readyz", nil, ""); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), `"shard-1":"unreachable"`) {
		t.Errorf("a shard down: %d %s, want 503 naming shard-1", r.status, r.body)
	}
	if r := do(t, http.MethodGet, "/readyz?partial=1", nil, ""); r.status != http.StatusOK {
		t.Errorf("a shard down, partial: %d %s, want 200", r.status, r.body)
	}
}

// Group commit under a shard's death: transfers for one shard are held in flight (a session
// locks the ledger, so their group waits on the lock), and more queue behind them to form the
// next groups; the shard is killed. Every one of them answers 503 (nothing is known, or nothing
// was done), and once the shard is back their retries apply each exactly once.
func TestShardKilledUnderGroupsInFlight(t *testing.T) {
	const n = 12
	downName := "shard-1"
	down := env.servers[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	locker, err := pgx.Connect(ctx, down.DSN())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := locker.Exec(ctx, "BEGIN; LOCK TABLE ledger_entries IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	keys, bodies := make([]string, n), make([]string, n)
	answers := make([]reply, n)
	var wg sync.WaitGroup
	for i := range n {
		keys[i], bodies[i] = newKey(), transferBody(accountOn(downName, int64(40000+i*100)), 1, int64(10+i))
		wg.Go(func() { answers[i] = post(t, keys[i], bodies[i]) })
	}
	waitFor(t, func() bool { // the first groups are in flight, waiting on the lock
		var waiting int
		err := env.pools[downName].QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE relation = 'ledger_entries'::regclass AND NOT granted").Scan(&waiting)
		return err == nil && waiting > 0
	})
	if err := down.Kill(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	locker.Close(ctx) //nolint:errcheck // its server is gone
	for i, a := range answers {
		if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") == "" {
			t.Errorf("transfer %d while its shard died: %d %s, want 503 with Retry-After", i, a.status, a.body)
		}
	}
	if err := down.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	env.pools[downName].Reset()
	for i := range n {
		waitFor(t, func() bool { return post(t, keys[i], bodies[i]).status == http.StatusCreated })
		if l := ledgerRows(t, downName, transferID(accountOn(downName, int64(40000+i*100)), keys[i])); l != 1 {
			t.Errorf("transfer %d: %d ledger rows after retries, want 1", i, l)
		}
	}
}
