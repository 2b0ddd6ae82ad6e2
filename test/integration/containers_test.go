package integration

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/shardgatetest"
)

// SHARDGATE_TEST_BACKEND chooses where the suite's shards run (shardgatetest.ChooseBackend):
// "local" starts them as local PostgreSQL processes, "docker" as containers of
// SHARDGATE_PG_IMAGE (default shardgate/postgres:15, see deploy/images/build-postgres-image.sh)
// on a private network, unset the first where PostgreSQL is installed. Any other value fails
// the run rather than silently testing another backend.
func TestShardsRunOnTheChosenBackend(t *testing.T) {
	want, err := shardgatetest.ChooseBackend("")
	if err != nil {
		t.Fatal(err)
	}
	_, container := env.servers[0].(*shardgatetest.ShardContainer)
	if env.shards.Backend != want || container != (want == shardgatetest.Docker) || (env.shards.Cluster() != nil) != container {
		t.Errorf("shards on %s (containers: %t), want %s", env.shards.Backend, container, want)
	}
}

// A shard container cut off the network: its transfers are a retryable 503, and once it is connected again the same key applies exactly once. Only containers can be cut
// off; with local processes Stop and Kill are the faults (failure_test.go).
func TestShardCutOffTheNetwork(t *testing.T) {
	if env.shards.Cluster() == nil {
		t.Skip("needs shard containers: SHARDGATE_TEST_BACKEND=docker")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, base := newRouter(t, env.mapPath, func(c *config.Config) {
		c.ShardPool.ConnectTimeout, c.ShardPool.RequestTimeout = time.Second, 2*time.Second
	})
	shard := env.servers[1].(*shardgatetest.ShardContainer)
	src, key := accountOn(shard.Name(), 50000), newKey()
	body := transferBody(src, 1, 25)
	if err := shard.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	connected := false
	defer func() {
		if !connected {
			shard.Connect(ctx) //nolint:errcheck // leave the suite a reachable shard
		}
	}()
	r := doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": key}, body)
	if r.status != http.StatusServiceUnavailable || r.problemType() != "shard-unavailable" || r.header.Get("Retry-After") == "" {
		t.Errorf("cut off: %d %v %s, want 503 shard-unavailable with Retry-After", r.status, r.header, r.body)
	}
	if err := shard.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	connected = true
	env.pools[shard.Name()].Reset() // the assertion pool's connections stalled with the network
	var again reply
	waitFor(t, func() bool {
		again = doAt(t, base, http.MethodPost, "/transfers", map[string]string{"Idempotency-Key": key}, body)
		return again.status != http.StatusServiceUnavailable
	})
	if again.status != http.StatusCreated || ledgerRows(t, shard.Name(), transferID(src, key)) != 1 {
		t.Errorf("after reconnecting: %d %s, want 201 and one ledger row", again.status, again.body)
	}
}
