package integration

import (
	"context"
	"fmt"
	"os"

	"github.com/shardgate/shardgate/shardgatetest"
)

// SHARDGATE_TEST_BACKEND chooses where the suite's shards run: unset or "local" starts them as
// local PostgreSQL processes; "docker" starts them as containers of SHARDGATE_PG_IMAGE
// (default shardgate/postgres:15, see deploy/images/build-postgres-image.sh) on a private
// network. Any other value fails the run rather than silently testing the local backend.
func init() {
	switch backend := os.Getenv("SHARDGATE_TEST_BACKEND"); backend {
	case "", "local":
	case "docker":
		startShards = containerShards
	default:
		startShards = func(context.Context, int, string) ([]shardServer, error) {
			return nil, fmt.Errorf("SHARDGATE_TEST_BACKEND=%q: use local or docker", backend)
		}
	}
}

// Stop, Restart and Close are what the suite needs; the cluster's network goes away with the
// last Close.
var _ shardServer = (*shardgatetest.Shard)(nil)

// containerShards starts n shard containers. Their DSNs name fixed host ports, so the router's
// pools, opened once with those DSNs, reach the same shard after a Restart. dir is unused: the
// data lives in the containers.
func containerShards(ctx context.Context, n int, _ string) ([]shardServer, error) {
	c, err := shardgatetest.StartCluster(ctx, n)
	if err != nil {
		return nil, err
	}
	out := make([]shardServer, n)
	for i, s := range c.Shards {
		out[i] = s
	}
	return out, nil
}
