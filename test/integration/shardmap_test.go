package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/router"
)

// Reloading a map that reopens every pool, while clients keep sending, fails no request.
func TestReloadUnderLoadFailsNoRequest(t *testing.T) {
	mapPath := filepath.Join(t.TempDir(), "shardmap.yaml")
	if err := writeMap(mapPath, 1, []string{"-80", "80-"}); err != nil {
		t.Fatal(err)
	}
	srv, base := newRouter(t, mapPath)

	var sent, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < 6; w++ {
		wg.Go(func() {
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": newKey()}, transferBody(40000+i, 1, 3))
				sent.Add(1)
				if r.status != http.StatusCreated {
					failed.Add(1)
					t.Errorf("during reload: %d %s", r.status, r.body)
				}
			}
		})
	}
	// Between reloads, let traffic flow: at least ten transfers each time.
	flowing := func() {
		n := sent.Load()
		waitFor(t, func() bool { return sent.Load() >= n+10 })
	}
	for v := 2; v <= 4; v++ {
		flowing()
		// A different application_name changes every DSN: every pool is replaced and drained.
		if err := writeMap(mapPath, v, []string{"-80", "80-"}, "&application_name=reload", string(rune('a'+v))); err != nil {
			t.Fatal(err)
		}
		if res, err := srv.Reload(mapPath); res != router.ReloadApplied {
			t.Fatalf("reload to version %d: %s %v", v, res, err)
		}
	}
	flowing()
	close(stop)
	wg.Wait()
	if srv.Topology().Map.Version != 4 {
		t.Errorf("serving version %d, want 4", srv.Topology().Map.Version)
	}
	t.Logf("%d transfers during 3 reloads, %d failed", sent.Load(), failed.Load())
}

// An invalid map, a lower version or a silent change under the same version is refused, and
// routing continues on the old map.
func TestRefusedReloadKeepsRouting(t *testing.T) {
	dir := t.TempDir()
	mapPath := filepath.Join(dir, "shardmap.yaml")
	if err := writeMap(mapPath, 5, []string{"-80", "80-"}); err != nil {
		t.Fatal(err)
	}
	srv, base := newRouter(t, mapPath)
	for name, write := range map[string]func() error{
		"gap in coverage":                func() error { return writeMap(mapPath, 6, []string{"-40", "80-"}) },
		"lower version":                  func() error { return writeMap(mapPath, 4, []string{"-80", "80-"}) },
		"same version, different ranges": func() error { return writeMap(mapPath, 5, []string{"-40", "40-"}) },
		"not YAML":                       func() error { return os.WriteFile(mapPath, []byte("version: [\n"), 0o600) },
	} {
		if err := write(); err != nil {
			t.Fatal(err)
		}
		res, err := srv.Reload(mapPath)
		if res != router.ReloadRefused || err == nil {
			t.Errorf("%s: reload %s, %v; want refused", name, res, err)
		}
		var got struct {
			Version int64 `json:"version"`
		}
		r := doAt(t, base, http.MethodGet, "/admin/shardmap", nil, "")
		if err := json.Unmarshal(r.body, &got); err != nil || got.Version != 5 {
			t.Errorf("%s: serving version %d (%v), want 5", name, got.Version, err)
		}
		if r := doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": newKey()}, transferBody(8842, 1, 1)); r.status != http.StatusCreated {
			t.Errorf("%s: transfer after refused reload: %d %s", name, r.status, r.body)
		}
	}
	if err := writeMap(mapPath, 5, []string{"-80", "80-"}); err != nil {
		t.Fatal(err)
	}
	if res, err := srv.Reload(mapPath); res != router.ReloadUnchanged {
		t.Errorf("rewriting the same map: %s %v, want unchanged", res, err)
	}
}

// A map file written in place can be read half-written, and a cut DSN can still be valid: here
// the shards' DSNs lose their options. The router takes it; the complete file, under the same
// version, must then get in too (once it was refused as "changed under the same version", and
// the shard stayed unusable until someone raised the version).
func TestCompleteMapReplacesHalfWrittenOne(t *testing.T) {
	dir := t.TempDir()
	mapPath := filepath.Join(dir, "shardmap.yaml")
	if err := writeMap(mapPath, 5, []string{"-80", "80-"}); err != nil {
		t.Fatal(err)
	}
	srv, base := newRouter(t, mapPath)
	if err := writeMap(mapPath, 5, []string{"-80", "80-"}, "&connect_timeout=1"); err != nil { // another DSN, same owners
		t.Fatal(err)
	}
	if res, err := srv.Reload(mapPath); res != router.ReloadApplied {
		t.Fatalf("same version, other DSNs: %s %v, want applied", res, err)
	}
	if err := writeMap(mapPath, 5, []string{"-80", "80-"}); err != nil {
		t.Fatal(err)
	}
	if res, err := srv.Reload(mapPath); res != router.ReloadApplied {
		t.Fatalf("the complete map again: %s %v, want applied", res, err)
	}
	if r := doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": newKey()}, transferBody(8842, 1, 1)); r.status != http.StatusCreated {
		t.Errorf("transfer after the complete map: %d %s", r.status, r.body)
	}
}

// Moving a key range between two real shards: its rows move with it, so keys completed before
// the move replay on the new owner; new transfers go to the new owner; a router kept on the old
// map is refused by the old owner, so no key is ever applied on both shards.
func TestRangeMoveFencesStaleRouter(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	current, stale := filepath.Join(dir, "current.yaml"), filepath.Join(dir, "stale.yaml")
	v := nextVersion(t)
	for _, p := range []string{current, stale} {
		if err := writeMap(p, v, []string{"-80", "80-"}); err != nil {
			t.Fatal(err)
		}
	}
	pools := func(s string) *pgxpool.Pool { return env.pools[s] }
	if _, err := rangemove.ApplyMap(ctx, mustLoad(t, current), pools, partition.Daily); err != nil {
		t.Fatal(err)
	}
	// Without replay caches: what the shards do with a stale router is what is tested.
	fresh, freshURL := newRouter(t, current, noReplayCache)
	_, staleURL := newRouter(t, stale, noReplayCache)
	t.Cleanup(func() {
		// Give the range back to shard-0 for the rest of the suite.
		if err := writeMap(current, v+2, []string{"-80", "80-"}); err != nil {
			t.Error(err)
		}
		if _, err := rangemove.ApplyMap(ctx, mustLoad(t, current), pools, partition.Daily); err != nil {
			t.Error(err)
		}
	})

	// An account in 40-80: owned by shard-0 now, by shard-1 after the move.
	var acct int64
	for a := int64(50000); ; a++ {
		if id := keyspaceOf(a); id >= 0x4000000000000000 && id < 0x8000000000000000 {
			acct = a
			break
		}
	}
	before := newKey()
	body := transferBody(acct, 2, 11)
	first := doAt(t, freshURL, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": before}, body)
	if first.status != http.StatusCreated {
		t.Fatalf("before the move: %d %s", first.status, first.body)
	}

	if err := writeMap(current, v+1, []string{"-40", "40-"}); err != nil {
		t.Fatal(err)
	}
	moves, err := rangemove.ApplyMap(ctx, mustLoad(t, current), pools, partition.Daily)
	if err != nil {
		t.Fatal(err)
	}
	if len(moves) != 1 || moves[0].From != "shard-0" || moves[0].To != "shard-1" || moves[0].Records < 1 || moves[0].Ledger < 1 {
		t.Fatalf("moves %+v, want rows of 40-80 copied from shard-0 to shard-1", moves)
	}
	// The same version with other ranges is refused by the shards, as by the routers.
	if err := writeMap(filepath.Join(dir, "changed.yaml"), v+1, []string{"-20", "20-"}); err != nil {
		t.Fatal(err)
	}
	if _, err := rangemove.ApplyMap(ctx, mustLoad(t, filepath.Join(dir, "changed.yaml")), pools, partition.Daily); !errors.Is(err, idem.ErrChangedMap) {
		t.Errorf("a changed map under version %d: %v, want ErrChangedMap", v+1, err)
	}
	// The router on the current file learns the new map from the shard's refusal, reloads and
	// routes again: the retry of a key completed before the move replays on the new owner.
	again := doAt(t, freshURL, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": before}, body)
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(first.body) {
		t.Fatalf("retry after the move: %d %s, want the replay", again.status, again.body)
	}
	if got := fresh.Topology().Map.Version; got != int64(v+1) {
		t.Errorf("router serves version %d after the refusal, want %d", got, v+1)
	}
	if n := ledgerRows(t, "shard-1", transferID(acct, before)); n != 1 {
		t.Errorf("moved transfer: %d rows on shard-1, want 1", n)
	}
	if n := ledgerRows(t, "shard-0", transferID(acct, before)); n != 0 {
		t.Errorf("moved transfer: %d rows left on shard-0, want 0 (it would count twice)", n)
	}

	after := newKey()
	if r := doAt(t, freshURL, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": after}, body); r.status != http.StatusCreated {
		t.Fatalf("new transfer after the move: %d %s", r.status, r.body)
	}
	if a, b := ledgerRows(t, "shard-0", transferID(acct, after)), ledgerRows(t, "shard-1", transferID(acct, after)); a != 0 || b != 1 {
		t.Errorf("new transfer: %d rows on shard-0, %d on shard-1; want it on the new owner only", a, b)
	}

	// The stale router (its file still has the version before the move) is refused by shard-0 for the same key
	// and for a new one: nothing is applied on the old owner.
	for _, key := range []string{after, newKey()} {
		r := doAt(t, staleURL, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": key}, body)
		if r.status != http.StatusServiceUnavailable || r.problemType() != "shard-map-changing" {
			t.Errorf("stale router: %d %s, want 503 shard-map-changing", r.status, r.body)
		}
		if n := ledgerRows(t, "shard-0", transferID(acct, key)); n != 0 {
			t.Errorf("stale router applied key on the old owner (%d rows)", n)
		}
	}
	if n := ledgerRows(t, "shard-1", transferID(acct, after)); n != 1 {
		t.Errorf("key %s has %d rows on the new owner, want exactly 1", after, n)
	}
}

// Removing a shard: a map that simply leaves it out is refused while it still holds ranges
// (its rows would stay behind and its keys apply again elsewhere); draining it with ranges: []
// moves its rows to the new owner, after which its keys replay there.
func TestRemovingAShardMovesItsRowsFirst(t *testing.T) {
	ctx := context.Background()
	mapPath := filepath.Join(t.TempDir(), "shardmap.yaml")
	pools := func(s string) *pgxpool.Pool { return env.pools[s] }
	v := nextVersion(t)
	t.Cleanup(func() {
		if err := writeMap(mapPath, v+2, []string{"-80", "80-"}); err != nil {
			t.Error(err)
		}
		if _, err := rangemove.ApplyMap(ctx, mustLoad(t, mapPath), pools, partition.Daily); err != nil {
			t.Error(err)
		}
	})
	acct := accountOn("shard-1", 60000)
	key, body := newKey(), transferBody(acct, 3, 17)
	first := post(t, key, body)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}

	if err := writeMap(mapPath, v, []string{"-"}); err != nil { // shard-1 simply left out
		t.Fatal(err)
	}
	if _, err := rangemove.ApplyMap(ctx, mustLoad(t, mapPath), pools, partition.Daily); err == nil || !strings.Contains(err.Error(), "removed from the map") {
		t.Fatalf("apply without the removed shard: %v, want a refusal", err)
	}
	if err := writeMap(mapPath, v+1, []string{"-", ""}); err != nil { // shard-1 drained
		t.Fatal(err)
	}
	if _, err := rangemove.ApplyMap(ctx, mustLoad(t, mapPath), pools, partition.Daily); err != nil {
		t.Fatal(err)
	}
	_, base := newRouter(t, mapPath)
	again := doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": key}, body)
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(first.body) {
		t.Fatalf("retry after the drain: %d %s, want the replay from shard-0", again.status, again.body)
	}
	if a, b := ledgerRows(t, "shard-0", transferID(acct, key)), ledgerRows(t, "shard-1", transferID(acct, key)); a != 1 || b != 0 {
		t.Errorf("after the drain: %d rows on shard-0, %d on shard-1; want 1 and 0", a, b)
	}
}

// nextVersion is a shard map version above every version the shards follow now.
func nextVersion(t testing.TB) int {
	t.Helper()
	v := int64(0)
	for name, p := range env.pools {
		o, err := idem.ReadOwnership(context.Background(), p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		v = max(v, o.MapVersion)
	}
	return int(v) + 1
}

// `shardmap apply --dry-run` names the ranges a map would move, with the rows they hold, and
// changes nothing on any shard.
func TestApplyDryRunChangesNothing(t *testing.T) {
	ctx := context.Background()
	src := accountOn("shard-0", 5000)
	if r := post(t, newKey(), transferBody(src, 1, 5)); r.status != http.StatusCreated {
		t.Fatalf("transfer: %d %s", r.status, r.body)
	}
	before := map[string]idem.Ownership{}
	for name, p := range env.pools {
		o, err := idem.ReadOwnership(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		before[name] = o
	}
	planned := filepath.Join(t.TempDir(), "shardmap.yaml")
	if err := writeMap(planned, nextVersion(t), []string{"", "-"}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := service.PlanMap(ctx, env.cfg, mustLoad(t, planned), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "would move -80 from shard-0 to shard-1: ") || strings.Contains(out.String(), " 0 ledger rows") {
		t.Errorf("plan:\n%s\nwant a move of -80 from shard-0 to shard-1 with its rows counted", out.String())
	}
	for name, p := range env.pools {
		o, err := idem.ReadOwnership(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if o.MapVersion != before[name].MapVersion || o.Applying != before[name].Applying || fmt.Sprint(o.Ranges) != fmt.Sprint(before[name].Ranges) {
			t.Errorf("%s: ownership %+v after a dry run, was %+v", name, o, before[name])
		}
	}
}
