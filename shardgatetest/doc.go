// Package shardgatetest runs shardgate for integration tests: PostgreSQL shards, migrated and
// owning their key ranges, and a router in front of them, started with one call and stopped
// with one, plus the faults a test needs (stop, restart, kill, pause and resume a shard).
//
// It is for teams whose services call shardgate and want to test against the real thing, and
// for shardgate's own suites:
//
//	func TestPayment(t *testing.T) {
//		env := shardgatetest.New(t, shardgatetest.Options{Shards: 2})
//		c, _ := client.New(env.URL, client.WithToken(env.Token))
//		rcpt, err := c.Send(ctx, client.NewTransfer(8842, 1190, 2500, "EUR"))
//		...
//	}
//
// # Backends
//
// The same [Env] runs on one of two backends, chosen by [Options.Backend], else by the
// environment variable SHARDGATE_TEST_BACKEND (local or docker), else local where PostgreSQL
// server binaries are installed and docker otherwise:
//
//   - [Local]: every shard is a PostgreSQL process started from the installed server binaries
//     (found via SHARDGATE_PG_BIN, pg_config --bindir or /usr/lib/postgresql/*/bin; Linux
//     only), and the router runs inside the test process on a loopback port. Fast: a
//     two-shard Env starts in about two seconds.
//   - [Docker]: every shard is a container of the PostgreSQL image and the router is a
//     container of the router image, on a private network, through testcontainers-go. Nothing
//     is pulled: the images (shardgate/postgres:15 and shardgate/router:dev by default;
//     SHARDGATE_PG_IMAGE and SHARDGATE_ROUTER_IMAGE name others, e.g. postgres:15 where a
//     registry is reachable) must exist locally, built by deploy/images/build-postgres-image.sh
//     and deploy/images/build-router-image.sh. This backend also offers what only containers
//     can do: cutting a shard off the network, SIGKILLing the router ([Env.Cluster]).
//
// Where neither backend can run, [New] skips the test — unless the environment variable CI is
// set, where it fails: a skipped test tests nothing.
//
// Every container and network is labelled [Label]; a CI step can remove what a crashed run
// left behind with docker rm -f $(docker ps -aq --filter label=dev.shardgate.test=true).
package shardgatetest
