package router

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/topology"
)

// TestIdentityChangeDropsOnlyThatShardsReplays: when a shard's identity changes, the replay
// cache forgets that shard's answers and keeps the others', the change is counted for that
// shard, and the log names the shard and both identities (no DSN).
func TestIdentityChangeDropsOnlyThatShardsReplays(t *testing.T) {
	ts := newTestServer(t, noAuth, downDSN)
	reqs := map[string][]idem.TransferRequest{}
	for i := range 6 {
		shard := []string{"s", "t"}[i%2]
		req := idem.TransferRequest{Scope: "c:transfer", Key: fmt.Sprintf("k%d", i), RequestHash: "h"}
		ts.replays.remember(shard, req, idem.TransferResult{Outcome: idem.Applied, Response: idem.Response{Status: 201, Body: "b"}})
		reqs[shard] = append(reqs[shard], req)
	}
	if got := counterValue(t, ts.metrics.identities.WithLabelValues("s")); got != 0 {
		t.Fatalf("identity changes of s before any: %v, want the series at 0", got)
	}
	ts.identityChanged(topology.IdentityChange{Shard: "s", Old: topology.Identity{SystemID: 7, Timeline: 1}, New: topology.Identity{SystemID: 7, Timeline: 2}})
	for shard, want := range map[string]bool{"s": false, "t": true} {
		for _, req := range reqs[shard] {
			if _, ok := ts.replays.get(req.Scope, req.Key, req.RequestHash); ok != want {
				t.Errorf("shard %s, key %s: cached %t after shard s changed identity, want %t", shard, req.Key, ok, want)
			}
		}
	}
	if got := counterValue(t, ts.metrics.identities.WithLabelValues("s")); got != 1 {
		t.Errorf("shardgate_shard_identity_changes_total{shard=s} = %v, want 1", got)
	}
	logs := ts.logs.String()
	for _, want := range []string{"level=ERROR", "SHARD IDENTITY CHANGED", "shard=s", "old_identity=7/1", "new_identity=7/2", "replay_cache_entries_dropped=3"} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
}

// TestNotReplicatedIsUnknownOutcome: a commit that stopped waiting for the synchronous standby
// is answered as an unknown outcome (503, retry with the same key), never 201.
func TestNotReplicatedIsUnknownOutcome(t *testing.T) {
	ts := newTestServer(t, noAuth, downDSN)
	rec := httptest.NewRecorder()
	res := idem.TransferResult{Outcome: idem.Applied, Response: idem.Response{Status: 201, Body: "b"}}
	if got := ts.answer(rec, "s", 1, idem.TransferRequest{}, res, fmt.Errorf("group: %w", topology.ErrNotReplicated)); got != outShardUnavailable {
		t.Errorf("outcome label %q, want %q", got, outShardUnavailable)
	}
	p := wantProblem(t, rec, probShardUnavailable, true)
	if !strings.Contains(p.Detail, "same Idempotency-Key") {
		t.Errorf("detail %q does not tell the client to retry with the same key", p.Detail)
	}
}
