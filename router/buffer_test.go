package router

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/pgtest/shardtest"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// The maps of a move of range 40-80 from shard sa to shard sb: before, and after.
const (
	mapBefore = "sa=-40,40-80 sb=80-"
	mapAfter  = "sa=-40 sb=40-80,80-"
)

// moveCluster is two real shards, sa and sb, owning mapBefore at version 1, and the map file
// the test's routers read.
type moveCluster struct {
	t       *testing.T
	pools   shardtest.Pools
	mapPath string
}

func newMoveCluster(t *testing.T) *moveCluster {
	t.Helper()
	c := &moveCluster{t: t, pools: shardtest.New(t, "sa", "sb"), mapPath: filepath.Join(t.TempDir(), "shardmap.yaml")}
	c.pools.Grant(t, c.writeMap(1, mapBefore))
	return c
}

// writeMap writes the map file (by a rename, as an operator's tooling does) with version v
// and owners as testkit.ShardMap takes them, and returns the map.
func (c *moveCluster) writeMap(v int64, owners string) *shardmap.Map {
	c.t.Helper()
	return testkit.WriteShardMap(c.t, c.mapPath, v, owners, func(name string) string { return c.pools[name].Config().ConnString() })
}

// fence starts the move to m: sa stops taking the range it gives up, as the first step of an
// apply does; sb does not take it before the grant.
func (c *moveCluster) fence(m *shardmap.Map) {
	c.t.Helper()
	o := idem.Ownership{Shard: "sa", MapVersion: m.Version, Ranges: m.Ownership()["sa"]}
	if err := idem.ApplyOwnership(context.Background(), c.pools["sa"], o, idem.Revoke); err != nil {
		c.t.Fatal(err)
	}
}

// finish completes the move to m: the range's rows are copied to sb, sb is granted it, and sa
// forgets it.
func (c *moveCluster) finish(m *shardmap.Map) {
	c.t.Helper()
	if _, err := rangemove.ApplyMap(context.Background(), m, c.pools.Pool, partition.Daily); err != nil {
		c.t.Fatalf("apply version %d: %v", m.Version, err)
	}
}

// debits counts the debits of transfer id on shard.
func (c *moveCluster) debits(shard, id string) int {
	c.t.Helper()
	var n int
	if err := c.pools[shard].QueryRow(context.Background(),
		"SELECT count(*) FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_out'", id).Scan(&n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// bufRouter is a router over the cluster's map file as it is when the router starts.
type bufRouter struct {
	*Server
	reg *prometheus.Registry
}

// router starts a router with auth off and the router.yaml lines extra.
func (c *moveCluster) router(extra string) *bufRouter {
	c.t.Helper()
	cfg, err := config.Parse(filepath.Join(filepath.Dir(c.mapPath), "router.yaml"),
		[]byte("shardmap: "+c.mapPath+"\nauth:\n  mode: none\n"+extra))
	if err != nil {
		c.t.Fatal(err)
	}
	m, err := shardmap.Load(c.mapPath)
	if err != nil {
		c.t.Fatal(err)
	}
	topo, err := topology.Open(m, nil, cfg.ShardPool)
	if err != nil {
		c.t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r := &bufRouter{Server: New(cfg, topo, slog.New(slog.NewTextHandler(testWriter{c.t}, nil)), reg), reg: reg}
	c.t.Cleanup(func() { r.Topology().Close() })
	return r
}

// testWriter sends a router's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// accountsIn returns n accounts whose keyspace ids lie in key range r.
func accountsIn(t *testing.T, r string, n int) []int64 {
	t.Helper()
	kr, err := shardmap.ParseKeyRange(r)
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for a := int64(1); len(out) < n; a++ {
		if kr.Contains(shardmap.KeyspaceID(a)) {
			out = append(out, a)
		}
	}
	return out
}

// answer is a POST /transfers answer and how long it took.
type answer struct {
	key  string
	rec  *httptest.ResponseRecorder
	took time.Duration
}

// post sends one transfer from src with key to r.
func (r *bufRouter) post(ctx context.Context, key string, src int64) answer {
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/transfers", strings.NewReader(fmt.Sprintf(`{"src":%d,"dst":%d,"amount":100}`, src, src+1)))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	start := time.Now()
	r.ServeHTTP(rec, req)
	return answer{key: key, rec: rec, took: time.Since(start)}
}

// get reads target from r.
func (r *bufRouter) get(target string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	return rec
}

// postAll posts every key (from the account at the same index) concurrently and returns the
// answers through a function that waits for them.
func (r *bufRouter) postAll(keys []string, srcs []int64) func() []answer {
	out := make([]answer, len(keys))
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() { out[i] = r.post(context.Background(), keys[i], srcs[i]) })
	}
	return func() []answer { wg.Wait(); return out }
}

// value reads a gauge, a counter or a histogram's count.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		panic(err)
	}
	switch {
	case d.Gauge != nil:
		return d.GetGauge().GetValue()
	case d.Histogram != nil:
		return float64(d.GetHistogram().GetSampleCount())
	}
	return d.GetCounter().GetValue()
}

// held returns how many requests r holds now.
func (r *bufRouter) held() int { return int(value(r.metrics.buffer.held)) }

// ended returns how many holdings ended with outcome.
func (r *bufRouter) ended(outcome string) int {
	return int(value(r.metrics.buffer.outcomes.WithLabelValues(outcome)))
}

// waitHeld waits until r holds n requests.
func (r *bufRouter) waitHeld(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); r.held() != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the router holds %d requests, want %d", r.held(), n)
		}
	}
}

// keys returns n keys named prefix-i.
func keys(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return out
}

// transferID is the id of key's transfer from src, as a router without auth makes it.
func transferID(key string, src int64) string {
	return TransferID(shardmap.KeyspaceID(src), config.AnonymousClient+":"+operation, key)
}

// want201 checks that every answer is a 201, a first application unless replays are allowed.
func want201(t *testing.T, answers []answer, replayOK bool) {
	t.Helper()
	for _, a := range answers {
		if a.rec.Code != http.StatusCreated || !replayOK && a.rec.Header().Get("Idempotent-Replayed") != "" {
			t.Errorf("key %s: %d %s after %s, want 201 applied", a.key, a.rec.Code, a.rec.Body, a.took)
		}
	}
}

// A range revoked from its old owner and granted to its new one while requests are posted into
// it: every request is held and then applied once, on the new owner, none is answered 503; keys
// completed before the move replay afterwards, byte for byte; other ranges are not held.
func TestBufferHoldsMovingRange(t *testing.T) {
	c := newMoveCluster(t)
	r := c.router("")
	moving, low, high := accountsIn(t, "40-80", 16), accountsIn(t, "-40", 4), accountsIn(t, "80-", 4)

	before := keys("before", 4)
	first := map[string]answer{}
	for i, k := range before {
		a := r.post(context.Background(), k, moving[i])
		want201(t, []answer{a}, false)
		first[k] = a
	}

	m2 := c.writeMap(2, mapAfter)
	c.fence(m2)
	if res, err := r.Reload(c.mapPath); res != ReloadApplied {
		t.Fatalf("reload: %s %v", res, err)
	}
	held := keys("during", len(moving))
	wait := r.postAll(held, moving)
	r.waitHeld(t, len(held))

	// Other ranges, on both shards, are served while the range is fenced.
	others := append(append([]int64{}, low...), high...)
	otherAnswers := r.postAll(keys("other", len(others)), others)()
	want201(t, otherAnswers, false)
	for _, a := range otherAnswers {
		if a.took > time.Second {
			t.Errorf("key %s of an unmoved range took %s", a.key, a.took)
		}
	}
	if r.held() != len(held) {
		t.Fatalf("holds %d requests before the grant, want %d", r.held(), len(held))
	}

	c.finish(m2)
	answers := wait()
	want201(t, answers, false)
	for i, a := range answers {
		id := transferID(a.key, moving[i])
		if got := a.rec.Header().Get("Location"); got != "/transfers/"+id {
			t.Errorf("key %s: Location %q, want /transfers/%s", a.key, got, id)
		}
		if sb, sa := c.debits("sb", id), c.debits("sa", id); sb != 1 || sa != 0 {
			t.Errorf("key %s: %d debits on the new owner and %d on the old, want 1 and 0", a.key, sb, sa)
		}
	}

	// Every key replays, as first answered, from the new owner: asked through a router without a
	// replay cache, so that the shard answers.
	fresh := c.router("replay_cache:\n  max_entries: 0\n")
	srcOf := map[string]int64{}
	for i, a := range answers {
		first[a.key], srcOf[a.key] = a, moving[i]
	}
	for i, k := range before {
		srcOf[k] = moving[i]
	}
	for _, k := range append(append([]string{}, before...), held...) {
		src := srcOf[k]
		a := fresh.post(context.Background(), k, src)
		if want := first[k]; a.rec.Code != http.StatusCreated || a.rec.Header().Get("Idempotent-Replayed") != "true" || a.rec.Body.String() != want.rec.Body.String() {
			t.Errorf("retry of %s: %d replayed=%q %s, want the first answer replayed: %s", k, a.rec.Code, a.rec.Header().Get("Idempotent-Replayed"), a.rec.Body, want.rec.Body)
		}
		if id := transferID(k, src); c.debits("sb", id) != 1 || c.debits("sa", id) != 0 {
			t.Errorf("key %s: not exactly one debit, on the new owner", k)
		}
	}

	if got := r.ended(bufSent); got != len(held) {
		t.Errorf("%d held requests were sent on, want %d", got, len(held))
	}
	if r.held() != 0 || r.ended(bufTimeout) != 0 || r.ended(bufOverflow) != 0 {
		t.Errorf("after the move: %d held, %d timed out, %d overflowed; want none", r.held(), r.ended(bufTimeout), r.ended(bufOverflow))
	}
	if n := value(r.metrics.transfers.WithLabelValues(outNotOwner, "sb")) + value(r.metrics.transfers.WithLabelValues(outNotOwner, "sa")); n != 0 {
		t.Errorf("%v requests answered not_owner, want none", n)
	}
	if n := value(r.metrics.buffer.wait); n != float64(len(held)) {
		t.Errorf("%v waits observed, want %d", n, len(held))
	}
}

// A router still on the old map posts into the range during the fence: the old owner's refusal
// makes it read its map file, where it finds the new owner, and it waits there for the grant.
func TestBufferRouterWithOldMapFindsNewOwner(t *testing.T) {
	c := newMoveCluster(t)
	r := c.router("")
	moving := accountsIn(t, "40-80", 8)
	m2 := testkit.ShardMap(t, 2, mapAfter, testkit.UnusedDSN)
	c.fence(m2)

	wait := r.postAll(keys("old-map", len(moving)), moving)
	r.waitHeld(t, len(moving))
	time.Sleep(150 * time.Millisecond)
	if v := r.Topology().Map.Version; v != 1 {
		t.Fatalf("serving version %d while the file still holds version 1", v)
	}
	// The operator's new map arrives; no watch runs here: the held requests' refusals make the
	// router read it.
	m2 = c.writeMap(2, mapAfter)
	for deadline := time.Now().Add(2 * time.Second); r.Topology().Map.Version != 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the router did not read the new map while its requests were refused")
		}
	}
	r.waitHeld(t, len(moving))
	c.finish(m2)
	answers := wait()
	want201(t, answers, false)
	for i, a := range answers {
		if id := transferID(a.key, moving[i]); c.debits("sb", id) != 1 || c.debits("sa", id) != 0 {
			t.Errorf("key %s not applied exactly once on the new owner", a.key)
		}
	}
}

// Two routers hold the same fenced range, one on the new map and one on the old, some keys sent
// to both: after the grant every key is applied exactly once, every answer is its 201 (or, for
// the copy that met the other in flight, 409), and each key then replays its first answer.
func TestBufferTwoRoutersSameRange(t *testing.T) {
	c := newMoveCluster(t)
	ra, rb := c.router(""), c.router("")
	moving := accountsIn(t, "40-80", 12)
	m2 := c.writeMap(2, mapAfter)
	c.fence(m2)
	if res, err := ra.Reload(c.mapPath); res != ReloadApplied {
		t.Fatalf("reload: %s %v", res, err)
	}
	// Keys 0-3 go to both routers, 4-7 to ra only, 8-11 to rb only.
	ks := keys("two", len(moving))
	waitA := ra.postAll(ks[:8], moving[:8])
	waitB := rb.postAll(append(append([]string{}, ks[:4]...), ks[8:]...), append(append([]int64{}, moving[:4]...), moving[8:]...))
	ra.waitHeld(t, 8)
	rb.waitHeld(t, 8)
	c.finish(m2)
	aa, ab := waitA(), waitB()
	want201(t, aa[4:], false)
	want201(t, ab[4:], false)
	for i := range 4 {
		codes := []int{aa[i].rec.Code, ab[i].rec.Code}
		applied := 0
		for _, a := range []answer{aa[i], ab[i]} {
			switch {
			case a.rec.Code == http.StatusCreated && a.rec.Header().Get("Idempotent-Replayed") == "":
				applied++
			case a.rec.Code == http.StatusCreated, a.rec.Code == http.StatusConflict:
			default:
				t.Errorf("key %s: %d %s", a.key, a.rec.Code, a.rec.Body)
			}
		}
		if applied > 1 {
			t.Errorf("key %s answered as applied by both routers: %v", ks[i], codes)
		}
	}
	for i, k := range ks {
		id := transferID(k, moving[i])
		if c.debits("sb", id) != 1 || c.debits("sa", id) != 0 {
			t.Errorf("key %s not applied exactly once on the new owner", k)
		}
		for _, r := range []*bufRouter{ra, rb} {
			a := r.post(context.Background(), k, moving[i])
			if a.rec.Code != http.StatusCreated || a.rec.Header().Get("Idempotent-Replayed") != "true" || a.rec.Header().Get("Location") != "/transfers/"+id {
				t.Errorf("retry of %s: %d replayed=%q %s", k, a.rec.Code, a.rec.Header().Get("Idempotent-Replayed"), a.rec.Body)
			}
		}
	}
	if rb.Topology().Map.Version != 2 {
		t.Errorf("the router on the old map serves version %d, want 2", rb.Topology().Map.Version)
	}
}

// want503 checks a 503 shard-map-changing with Retry-After.
func want503(t *testing.T, a answer) {
	t.Helper()
	if a.rec.Code != http.StatusServiceUnavailable || !strings.Contains(a.rec.Body.String(), probStaleMap.slug) || a.rec.Header().Get("Retry-After") == "" {
		t.Errorf("key %s: %d Retry-After=%q %s, want 503 %s with Retry-After", a.key, a.rec.Code, a.rec.Header().Get("Retry-After"), a.rec.Body, probStaleMap.slug)
	}
}

// Past buffering's bounds a request gets 503 with Retry-After, never a hang: one more than
// max_requests at once, a held one after max_wait. Nothing is applied. With buffering off the
// refusal is answered at once.
func TestBufferBoundExceeded(t *testing.T) {
	c := newMoveCluster(t)
	r := c.router("buffering:\n  max_wait: 2s\n  max_requests: 2\n")
	moving := accountsIn(t, "40-80", 3)
	c.fence(c.writeMap(2, mapAfter)) // sa refuses the range, and sb is not granted it
	if res, err := r.Reload(c.mapPath); res != ReloadApplied {
		t.Fatalf("reload: %s %v", res, err)
	}
	wait := r.postAll(keys("bound", 2), moving[:2])
	r.waitHeld(t, 2)
	over := r.post(context.Background(), "bound-over", moving[2])
	want503(t, over)
	if over.took > time.Second {
		t.Errorf("the request over max_requests was answered after %s, want at once", over.took)
	}
	for _, a := range wait() {
		want503(t, a)
		if a.took < 2*time.Second || a.took > 3500*time.Millisecond {
			t.Errorf("key %s held %s, want max_wait (2s) and little more", a.key, a.took)
		}
	}
	if r.held() != 0 || r.ended(bufTimeout) != 2 || r.ended(bufOverflow) != 1 || r.ended(bufSent) != 0 {
		t.Errorf("held %d, timeout %d, overflow %d, sent %d; want 0, 2, 1, 0", r.held(), r.ended(bufTimeout), r.ended(bufOverflow), r.ended(bufSent))
	}
	if n := r.buffer.nfences.Load(); n != 0 {
		t.Errorf("%d fences left after their last request gave up, want none: the next request would be held untried", n)
	}
	for i, k := range append(keys("bound", 2), "bound-over") {
		if id := transferID(k, moving[i]); c.debits("sa", id)+c.debits("sb", id) != 0 {
			t.Errorf("key %s was applied", k)
		}
	}

	off := c.router("buffering:\n  max_requests: 0\n") // on the map of version 2 from the start
	a := off.post(context.Background(), "unbuffered", moving[0])
	want503(t, a)
	if a.took > time.Second || off.ended(bufTimeout)+off.ended(bufOverflow) != 0 {
		t.Errorf("with buffering off: answered after %s, %d counted as held", a.took, off.ended(bufTimeout)+off.ended(bufOverflow))
	}
}

// A client that goes away while held frees its place at once, and its key was applied
// nowhere: the next request is held in that place, and the key applies later, once.
func TestBufferClientCancelFreesSlot(t *testing.T) {
	c := newMoveCluster(t)
	r := c.router("buffering:\n  max_wait: 4s\n  max_requests: 1\n")
	moving := accountsIn(t, "40-80", 2)
	m2 := c.writeMap(2, mapAfter)
	c.fence(m2)
	if res, err := r.Reload(c.mapPath); res != ReloadApplied {
		t.Fatalf("reload: %s %v", res, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan answer)
	go func() { gone <- r.post(ctx, "cancel-a", moving[0]) }()
	r.waitHeld(t, 1)
	cancel()
	select {
	case a := <-gone:
		if a.took > 2*time.Second {
			t.Errorf("the canceled request was held %s", a.took)
		}
	case <-time.After(time.Second):
		t.Fatal("a canceled request is still held a second later")
	}
	r.waitHeld(t, 0)
	if r.ended(bufCanceled) != 1 {
		t.Errorf("%d holdings ended canceled, want 1", r.ended(bufCanceled))
	}

	wait := r.postAll([]string{"cancel-b"}, moving[1:])
	r.waitHeld(t, 1)
	c.finish(m2)
	want201(t, wait(), false)
	if r.ended(bufOverflow) != 0 {
		t.Errorf("%d requests overflowed, want none", r.ended(bufOverflow))
	}
	idA := transferID("cancel-a", moving[0])
	if n := c.debits("sa", idA) + c.debits("sb", idA); n != 0 {
		t.Fatalf("the canceled key has %d debits, want none", n)
	}
	a := r.post(context.Background(), "cancel-a", moving[0])
	want201(t, []answer{a}, false)
	if c.debits("sb", idA) != 1 {
		t.Error("the canceled key's retry is not applied once on the new owner")
	}
}

// A router that read the new map before the move's fence sends the range's requests to its old
// owner, which still holds the range while its rows are copied: applied there at once, not held,
// and replayed by the new owner after the move.
func TestBufferNewMapBeforeFenceUsesOldOwner(t *testing.T) {
	c := newMoveCluster(t)
	r := c.router("")
	moving := accountsIn(t, "40-80", 4)
	m2 := c.writeMap(2, mapAfter)
	if res, err := r.Reload(c.mapPath); res != ReloadApplied {
		t.Fatalf("reload: %s %v", res, err)
	}
	var first []answer
	for i, k := range keys("copying", len(moving)) {
		first = append(first, r.post(context.Background(), k, moving[i]))
	}
	want201(t, first, false)
	// The new owner refused the first; the others went to the old owner first.
	if n := value(r.metrics.shardTime.WithLabelValues("sb", string(idem.NotOwner)).(prometheus.Histogram)); n != 1 {
		t.Errorf("the new owner refused %v requests, want the first only", n)
	}
	for i, a := range first {
		if id := transferID(a.key, moving[i]); c.debits("sa", id) != 1 || c.debits("sb", id) != 0 {
			t.Errorf("key %s: not applied once on the old owner", a.key)
		}
		if a.took > time.Second {
			t.Errorf("key %s took %s", a.key, a.took)
		}
	}
	if r.ended(bufSent)+r.ended(bufTimeout) != 0 {
		t.Errorf("requests were held while the old owner still held the range")
	}
	// What was just written reads back, from the old owner, which holds the range's rows.
	for _, a := range first {
		g := r.get(a.rec.Header().Get("Location"))
		if g.Code != http.StatusOK || !strings.Contains(g.Body.String(), `"amount":100`) {
			t.Errorf("GET %s while the range is copied: %d %s", a.rec.Header().Get("Location"), g.Code, g.Body)
		}
	}
	if g := r.get(fmt.Sprintf("/accounts/%d/balance", moving[0])); g.Code != http.StatusOK || !strings.Contains(g.Body.String(), `"debits":100`) {
		t.Errorf("balance of account %d while its range is copied: %d %s", moving[0], g.Code, g.Body)
	}
	c.finish(m2)
	fresh := c.router("replay_cache:\n  max_entries: 0\n")
	for i, a := range first {
		b := fresh.post(context.Background(), a.key, moving[i])
		if b.rec.Code != http.StatusCreated || b.rec.Header().Get("Idempotent-Replayed") != "true" || b.rec.Body.String() != a.rec.Body.String() {
			t.Errorf("retry of %s after the move: %d %s, want its first answer replayed", a.key, b.rec.Code, b.rec.Body)
		}
		if id := transferID(a.key, moving[i]); c.debits("sb", id) != 1 || c.debits("sa", id) != 0 {
			t.Errorf("key %s: not exactly one debit, on the new owner, after the move", a.key)
		}
	}
}

// A whole move under load, as an operator runs it: the file edited, one router reading it and
// one not, clients posting new keys into the moving range and elsewhere all along. No request
// gets anything but its 201, and every key ends up applied once, on its range's owner.
func TestBufferMoveUnderLoad(t *testing.T) {
	c := newMoveCluster(t)
	routers := []*bufRouter{c.router(""), c.router("")}
	m2 := c.writeMap(2, mapAfter)
	if res, err := routers[0].Reload(c.mapPath); res != ReloadApplied {
		t.Fatalf("reload: %s %v", res, err)
	}
	type posted struct {
		key string
		src int64
		a   answer
	}
	srcs := append(accountsIn(t, "40-80", 8), accountsIn(t, "-40", 2)...)
	srcs = append(srcs, accountsIn(t, "80-", 2)...)
	var (
		mu   sync.Mutex
		all  []posted
		wg   sync.WaitGroup
		stop = make(chan struct{})
	)
	for i, src := range srcs {
		wg.Go(func() {
			r := routers[i%2]
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("load-%d-%d", i, n)
				a := r.post(context.Background(), k, src)
				mu.Lock()
				all = append(all, posted{k, src, a})
				mu.Unlock()
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	c.finish(m2)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()

	moving, _ := shardmap.ParseKeyRange("40-80")
	low, _ := shardmap.ParseKeyRange("-40")
	var longest time.Duration
	for _, p := range all {
		want201(t, []answer{p.a}, false)
		owner, other := "sb", "sa"
		if low.Contains(shardmap.KeyspaceID(p.src)) {
			owner, other = "sa", "sb"
		}
		if moving.Contains(shardmap.KeyspaceID(p.src)) {
			longest = max(longest, p.a.took)
		}
		if id := transferID(p.key, p.src); c.debits(owner, id) != 1 || c.debits(other, id) != 0 {
			t.Errorf("key %s (account %d): not applied once, on %s", p.key, p.src, owner)
		}
	}
	t.Logf("%d transfers posted during the move; the longest in the moving range took %s", len(all), longest)
	if len(all) < len(srcs) {
		t.Fatalf("only %d transfers posted", len(all))
	}
}
