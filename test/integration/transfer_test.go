package integration

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// The guide's verification, repeated over many keys on both shards: twenty parallel requests
// with one key give exactly one ledger row and one completed record; every other answer is a
// byte-identical replay of the 201 or a 409.
func TestConcurrentSameKeyAppliesOnce(t *testing.T) {
	const keys, attempts = 24, 20
	type result struct {
		key, body string
		src       int64
		resp      reply
	}
	results := make(chan result, keys*attempts)
	var wg sync.WaitGroup
	for k := 0; k < keys; k++ {
		key := newKey()
		src := int64(1000 + k)
		body := transferBody(src, 77, int64(100+k))
		for a := 0; a < attempts; a++ {
			wg.Go(func() { results <- result{key, body, src, post(t, key, body)} })
		}
	}
	wg.Wait()
	close(results)

	type perKey struct {
		body              string
		src               int64
		created           [][]byte
		replays, inFlight int
	}
	byKey := map[string]*perKey{}
	for r := range results {
		pk := byKey[r.key]
		if pk == nil {
			pk = &perKey{body: r.body, src: r.src}
			byKey[r.key] = pk
		}
		switch {
		case r.resp.status == http.StatusCreated && r.resp.header.Get("Idempotent-Replayed") == "":
			pk.created = append(pk.created, r.resp.body)
		case r.resp.status == http.StatusCreated:
			pk.replays++
		case r.resp.status == http.StatusConflict && r.resp.problemType() == "request-in-progress":
			if r.resp.header.Get("Retry-After") != "1" {
				t.Errorf("409 without Retry-After: 1: %v", r.resp.header)
			}
			pk.inFlight++
		default:
			t.Errorf("key %s: unexpected %d %s", r.key, r.resp.status, r.resp.body)
		}
	}
	shardsUsed := map[string]bool{}
	for key, pk := range byKey {
		shard := shardOf(pk.src)
		shardsUsed[shard] = true
		if len(pk.created) != 1 {
			t.Errorf("key %s: %d first-time 201s, want exactly 1", key, len(pk.created))
		}
		if got := ledgerRows(t, shard, transferID(pk.src, key)); got != 1 {
			t.Errorf("key %s: %d ledger rows on %s, want 1", key, got, shard)
		}
		if all, done := records(t, shard, key); all != 1 || done != 1 {
			t.Errorf("key %s: %d records (%d completed), want 1 completed", key, all, done)
		}
		// Every later attempt replays the first response exactly.
		again := post(t, key, pk.body)
		if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || len(pk.created) == 1 && !bytes.Equal(again.body, pk.created[0]) {
			t.Errorf("key %s: retry got %d %q, want a replay of %q", key, again.status, again.body, pk.created)
		}
	}
	if len(shardsUsed) != numShards {
		t.Errorf("keys landed on %d shards, want all %d", len(shardsUsed), numShards)
	}
}

func TestReplayIsByteIdentical(t *testing.T) {
	key := newKey()
	first := post(t, key, `{"src": 8842, "dst": 1190, "amount": 2500}`)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	id := transferID(8842, key)
	if loc := first.header.Get("Location"); loc != "/transfers/"+id {
		t.Fatalf("Location %q, want /transfers/%s", loc, id)
	}
	if first.header.Get("Idempotent-Replayed") != "" {
		t.Fatal("first response marked as replayed")
	}
	ledgerBefore, recsBefore := totals(t)
	// Same request: other key order, other whitespace, the default currency spelled out.
	second := post(t, key, "{\"amount\":2500,\n \"currency\": \"EUR\", \"dst\":1190,\"src\":8842}")
	if second.status != first.status || !bytes.Equal(second.body, first.body) {
		t.Fatalf("replay %d %q differs from first %d %q", second.status, second.body, first.status, first.body)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if second.header.Get(h) != first.header.Get(h) {
			t.Errorf("replayed %s %q, first %q", h, second.header.Get(h), first.header.Get(h))
		}
	}
	if second.header.Get("Idempotent-Replayed") != "true" {
		t.Error("replay lacks Idempotent-Replayed: true")
	}
	if l, r := totals(t); l != ledgerBefore || r != recsBefore {
		t.Errorf("replay wrote rows: ledger %d->%d, records %d->%d", ledgerBefore, l, recsBefore, r)
	}
	// The bare and the structured-field forms of a key are the same key.
	third := do(t, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": `"` + key + `"`}, `{"src":8842,"dst":1190,"amount":2500}`)
	if third.status != http.StatusCreated || third.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(third.body, first.body) {
		t.Errorf("sf-string form of the key: %d %q, want the replay", third.status, third.body)
	}
	if n := ledgerRows(t, shardOf(8842), id); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	// GET finds the transfer on its shard; another client does not.
	got := do(t, http.MethodGet, "/transfers/"+id, nil, "")
	if got.status != http.StatusOK || !strings.Contains(string(got.body), `"amount":2500`) {
		t.Errorf("GET: %d %s", got.status, got.body)
	}
	other := do(t, http.MethodGet, "/transfers/"+id, map[string]string{"Authorization": "Bearer token-b"}, "")
	if other.status != http.StatusNotFound {
		t.Errorf("GET by another client: %d %s, want 404", other.status, other.body)
	}
}

func TestSameKeyDifferentRequestIs422(t *testing.T) {
	key := newKey()
	if r := post(t, key, transferBody(5001, 5002, 300)); r.status != http.StatusCreated {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	for name, body := range map[string]string{
		"amount":    transferBody(5001, 5002, 301),
		"dst":       transferBody(5001, 5003, 300),
		"currency":  `{"src":5001,"dst":5002,"amount":300,"currency":"USD"}`,
		"reference": `{"src":5001,"dst":5002,"amount":300,"reference":"x"}`,
	} {
		r := post(t, key, body)
		if r.status != http.StatusUnprocessableEntity || r.problemType() != "idempotency-key-reused" {
			t.Errorf("%s changed: %d %s, want 422 idempotency-key-reused", name, r.status, r.body)
		}
	}
	if n := ledgerRows(t, shardOf(5001), transferID(5001, key)); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// While a first attempt is held open on its shard, a duplicate gets 409 at once (not after the
// first attempt's duration), a different request with the key gets 422, and once the first
// commits a retry replays it.
func TestInFlightDuplicateIs409Promptly(t *testing.T) {
	const src = 6001
	shard := shardOf(src)
	key := newKey()
	body := transferBody(src, 6002, 700)

	// Hold the first attempt: it blocks on the ledger insert while holding its key's locks.
	release := holdLedger(t, shard)
	firstDone := make(chan reply, 1)
	go func() { firstDone <- post(t, key, body) }()
	waitFor(t, func() bool { return lockWaiters(t, shard) > 0 })

	start := time.Now()
	dup := post(t, key, body)
	if elapsed := time.Since(start); elapsed > prompt {
		t.Errorf("duplicate answered after %v; it must not wait for the first attempt", elapsed)
	}
	if dup.status != http.StatusConflict || dup.problemType() != "request-in-progress" || dup.header.Get("Retry-After") != "1" {
		t.Errorf("duplicate: %d %v %s, want 409 request-in-progress with Retry-After: 1", dup.status, dup.header, dup.body)
	}
	diff := post(t, key, transferBody(src, 6002, 701))
	if diff.status != http.StatusUnprocessableEntity || diff.problemType() != "idempotency-key-reused" {
		t.Errorf("different request while in flight: %d %s, want 422", diff.status, diff.body)
	}

	release()
	first := <-firstDone
	if first.status != http.StatusCreated {
		t.Fatalf("first attempt: %d %s", first.status, first.body)
	}
	retry := post(t, key, body)
	if retry.status != http.StatusCreated || !bytes.Equal(retry.body, first.body) || retry.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry after commit: %d %s, want the replay", retry.status, retry.body)
	}
	if n := ledgerRows(t, shard, transferID(src, key)); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// Groups stuck on a shard (each attempt waits on the ledger lock) do not hold up its other
// transfers: two groups are stuck (at least group_commit.in_flight, whatever its value up to 2),
// and after group_commit.stall_after the next group goes beside them, so a duplicate of a stuck
// attempt is still answered 409 at once.
func TestStuckGroupsDoNotHoldUpTheShard(t *testing.T) {
	const src = 6101
	shard := shardOf(src)
	release := holdLedger(t, shard)
	keys := []string{newKey(), newKey()}
	done := make(chan reply, len(keys))
	for i, key := range keys {
		go func() { done <- post(t, key, transferBody(src, 6102, int64(800+i))) }()
		waitFor(t, func() bool { return lockWaiters(t, shard) > i })
	}

	start := time.Now()
	dup := post(t, keys[0], transferBody(src, 6102, 800))
	if elapsed := time.Since(start); elapsed > prompt {
		t.Errorf("duplicate answered after %v behind two stuck groups; it must go beside them", elapsed)
	}
	if dup.status != http.StatusConflict || dup.problemType() != "request-in-progress" {
		t.Errorf("duplicate: %d %s, want 409 request-in-progress", dup.status, dup.body)
	}

	release()
	for range keys {
		if r := <-done; r.status != http.StatusCreated {
			t.Errorf("a stuck attempt after the release: %d %s, want 201", r.status, r.body)
		}
	}
	for _, key := range keys {
		if n := ledgerRows(t, shard, transferID(src, key)); n != 1 {
			t.Errorf("key %s: %d ledger rows, want 1", key, n)
		}
	}
}

// holdLedger locks shard's ledger against writes until release is called (or the test ends):
// a transfer reaching its debit then waits there, holding its key's locks.
func holdLedger(t testing.TB, shard string) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := env.pools[shard].Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE ledger_entries IN EXCLUSIVE MODE"); err != nil {
		tx.Rollback(ctx) //nolint:errcheck
		t.Fatal(err)
	}
	var once sync.Once
	release = func() { once.Do(func() { tx.Rollback(ctx) }) } //nolint:errcheck // rollback only ends the hold
	t.Cleanup(release)
	return release
}

// lockWaiters counts transfer attempts (debits, or credits a relay delivers) on shard waiting
// for a lock: every attempt is one shardgate_apply_rows or shardgate_apply_batch statement.
func lockWaiters(t testing.TB, shard string) int {
	var n int
	if err := env.pools[shard].QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%shardgate\\_apply\\_%'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Each transfer lands on the shard the map names, and only there.
func TestTransfersLandOnOwningShard(t *testing.T) {
	perShard := map[string]int{}
	for acct := int64(20000); acct < 20060; acct++ {
		key := newKey()
		if r := post(t, key, transferBody(acct, 1, 5)); r.status != http.StatusCreated {
			t.Fatalf("account %d: %d %s", acct, r.status, r.body)
		}
		owner := shardOf(acct)
		perShard[owner]++
		for name := range env.pools {
			want := 0
			if name == owner {
				want = 1
			}
			if got := ledgerRows(t, name, transferID(acct, key)); got != want {
				t.Errorf("account %d (owner %s): %d rows on %s, want %d", acct, owner, got, name, want)
			}
		}
	}
	if len(perShard) != numShards {
		t.Errorf("60 accounts landed on %v; want every shard used", perShard)
	}
}

// A retry of a completed key is replayed by the router from its replay cache, byte for byte,
// without asking the shard (here the record is gone from the shard, and the router still
// replays it). The cache serves only the same client and the same request: another client's
// use of the key and another body under it go to the shard, which decides.
func TestReplayCacheServesOnlyTheSameRequestOfTheSameClient(t *testing.T) {
	const src = 7301
	shard := shardOf(src)
	key := newKey()
	body := transferBody(src, 7302, 12)
	first := post(t, key, body)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	if _, err := env.pools[shard].Exec(context.Background(), "DELETE FROM idempotency_record WHERE key = $1", key); err != nil {
		t.Fatal(err)
	}
	again := post(t, key, body)
	if again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Location") != first.header.Get("Location") {
		t.Fatalf("retry: %d %s %v, want the first answer replayed from the cache", again.status, again.body, again.header)
	}
	// Another body under the key is not the cached request: the shard answers (its record is
	// gone and the debit is young, so: record missing, retry later).
	if r := post(t, key, transferBody(src, 7302, 13)); r.status != http.StatusServiceUnavailable || r.problemType() != "idempotency-record-missing" {
		t.Errorf("other body: %d %s, want the shard's answer (503 idempotency-record-missing)", r.status, r.body)
	}
	// Another client's key is another scope: never served from client-a's cache entry.
	other := do(t, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": key, "Authorization": "Bearer token-b"}, body)
	if other.status != http.StatusCreated || other.header.Get("Idempotent-Replayed") == "true" || bytes.Equal(other.body, first.body) {
		t.Errorf("client-b with client-a's key: %d %s, want a transfer of its own", other.status, other.body)
	}
	if n := ledgerRows(t, shard, transferID(src, key)); n != 1 {
		t.Errorf("%d ledger rows of client-a's transfer, want 1", n)
	}
}
