// Package containers is the Docker backend of shardgatetest: every shard a container of the
// PostgreSQL image and the router a container of the router image, on a private network,
// through testcontainers-go. It is a Go module of its own, so that a module testing against
// local PostgreSQL processes does not depend on testcontainers-go and Docker's client. Import
// it in a test to make [shardgatetest.Docker] available:
//
//	import (
//		"github.com/shardgate/shardgate/shardgatetest"
//		"github.com/shardgate/shardgate/shardgatetest/containers"
//	)
//
//	func TestPaymentSurvivesAPartition(t *testing.T) {
//		env := shardgatetest.New(t, shardgatetest.Options{Backend: shardgatetest.Docker})
//		shard := containers.ClusterOf(env).Shards[1]
//		shard.Disconnect(ctx) // and Connect; containers.RouterOf(env).Kill, Restart
//		...
//	}
//
// Nothing is pulled: the images (shardgate/postgres:15 and shardgate/router:dev by default;
// SHARDGATE_PG_IMAGE and SHARDGATE_ROUTER_IMAGE name others, e.g. postgres:15 where a registry
// is reachable) must exist locally, built by deploy/images/build-postgres-image.sh and
// deploy/images/build-router-image.sh.
//
// Every container and network is labelled [Label]; a CI step can remove what a crashed run
// left behind with docker rm -f $(docker ps -aq --filter label=dev.shardgate.test=true).
package containers

import (
	"context"
	"fmt"

	"github.com/shardgate/shardgate/shardgatetest"
)

func init() { shardgatetest.RegisterContainerBackend(backend{}) }

// backend is the Docker backend as shardgatetest drives it.
type backend struct{}

func (backend) Available(ctx context.Context, withRouter bool) error {
	cli, err := DockerClient(ctx, Image())
	if err != nil {
		return err
	}
	defer cli.Close()
	if withRouter {
		return checkRouterImage(ctx, cli)
	}
	return nil
}

func (backend) StartShards(ctx context.Context, n int) (shardgatetest.ContainerShards, error) {
	c, err := StartCluster(ctx, n)
	if err != nil {
		return nil, err
	}
	return clusterShards{c}, nil
}

// clusterShards is a Cluster as shardgatetest sees it.
type clusterShards struct{ c *Cluster }

func (s clusterShards) Shards() []shardgatetest.Shard {
	out := make([]shardgatetest.Shard, len(s.c.Shards))
	for i, sh := range s.c.Shards {
		out[i] = sh
	}
	return out
}

func (s clusterShards) StartRouter(ctx context.Context, routerYAML []byte, shardmapYAML func([]string) []byte) (shardgatetest.ContainerRouter, error) {
	dsns := make([]string, len(s.c.Shards))
	for i, sh := range s.c.Shards {
		dsns[i] = sh.NetworkDSN()
	}
	return s.c.StartRouter(ctx, routerYAML, shardmapYAML(dsns))
}

func (s clusterShards) Close() error { return s.c.Close() }

var (
	_ shardgatetest.Shard           = (*ShardContainer)(nil)
	_ shardgatetest.ContainerRouter = (*RouterContainer)(nil)
)

// ClusterOf returns the shard containers of an Env or a ShardSet on the Docker backend, for
// the faults only containers have (ShardContainer.Disconnect and Connect); nil on the local
// backend.
func ClusterOf(e interface {
	Cluster() shardgatetest.ContainerShards
}) *Cluster {
	if s, ok := e.Cluster().(clusterShards); ok {
		return s.c
	}
	return nil
}

// RouterOf returns the router container of an Env on the Docker backend, which can be killed
// and restarted; nil on the local backend.
func RouterOf(e *shardgatetest.Env) *RouterContainer {
	r, _ := e.RouterContainer().(*RouterContainer)
	return r
}

// shardName is the name of the i-th shard, in the shard map and on the cluster network.
func shardName(i int) string { return fmt.Sprintf("shard-%d", i) }
