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
//     container of the router image, on a private network, through testcontainers-go. It is
//     the module github.com/shardgate/shardgate/shardgatetest/containers ([ContainerModule]),
//     so that a module using the local backend does not depend on testcontainers-go and
//     Docker's client: a test that runs on Docker imports that package, which registers the
//     backend and offers the faults only containers have (cutting a shard off the network,
//     SIGKILLing the router).
//
// Where neither backend can run, [New] skips the test — unless the environment variable CI is
// set, where it fails: a skipped test tests nothing.
package shardgatetest
