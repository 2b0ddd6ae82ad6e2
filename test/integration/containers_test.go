package integration

import (
	"testing"

	"github.com/shardgate/shardgate/shardgatetest"
)

// SHARDGATE_TEST_BACKEND chooses where the suite's shards run (shardgatetest.ChooseBackend):
// "local" starts them as local PostgreSQL processes, unset too where PostgreSQL is installed.
// This suite is in the main module, which does not link the Docker backend (a module of its own,
// shardgatetest/containers, whose tests cover shard and router containers): "docker" here
// fails the run with what to import, rather than silently testing another backend.
func TestShardsRunOnTheChosenBackend(t *testing.T) {
	want, err := shardgatetest.ChooseBackend("")
	if err != nil {
		t.Fatal(err)
	}
	if env.shards.Backend != want || env.shards.Cluster() != nil {
		t.Errorf("shards on %s (containers: %t), want %s", env.shards.Backend, env.shards.Cluster() != nil, want)
	}
}
