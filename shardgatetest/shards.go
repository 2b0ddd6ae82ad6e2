package shardgatetest

import (
	"context"
	"errors"
	"fmt"
)

// Shard is one PostgreSQL shard, on either backend. Its DSN stays the same across Stop, Kill
// and Restart, so pools opened with it (the router's too) reconnect once it is back. Its
// methods are safe for concurrent use.
type Shard interface {
	// Name is the shard's name in the shard map: shard-0, shard-1, ...
	Name() string
	// DSN is a connection URL from the host, password included: do not log it.
	DSN() string
	// Password is the database password in DSN, random per shard, so that a test can check it
	// never reaches a log.
	Password() string
	// Stop shuts the server down cleanly (PostgreSQL's fast shutdown).
	Stop(ctx context.Context) error
	// Restart starts a stopped or killed server again and waits until it answers; after a
	// Kill, PostgreSQL first runs crash recovery.
	Restart(ctx context.Context) error
	// Kill ends the server with SIGKILL, as in a crash: no shutdown checkpoint.
	Kill(ctx context.Context) error
	// Pause freezes every process of the server: connections stay open and nothing
	// answers, as with a host hung on I/O.
	Pause(ctx context.Context) error
	// Resume undoes Pause.
	Resume(ctx context.Context) error
}

// shardName is the name of the i-th shard, on either backend and in the shard map.
func shardName(i int) string { return fmt.Sprintf("shard-%d", i) }

// ShardSet is a set of empty PostgreSQL shards on one backend — not migrated, owning nothing —
// for a suite that runs routers of its own. [Start] builds an [Env] on one.
type ShardSet struct {
	// Backend is where the shards run.
	Backend Backend
	// Shards are shard-0, shard-1, ... in order.
	Shards  []Shard
	cluster ContainerShards // the Docker backend's containers
	closers []func() error
}

// MaxShards bounds Options.Shards and StartShards: enough for any test, and each shard costs
// a PostgreSQL server.
const MaxShards = 16

// StartShards starts n empty shards on backend (see [ChooseBackend] for an empty one),
// concurrently. On error, whatever was started is stopped.
func StartShards(ctx context.Context, backend Backend, n int) (*ShardSet, error) {
	b, err := ChooseBackend(backend)
	if err != nil {
		return nil, err
	}
	if n < 1 || n > MaxShards {
		return nil, fmt.Errorf("shardgatetest: %d shards: start between 1 and %d", n, MaxShards)
	}
	if b == Local {
		return startLocalShards(ctx, n)
	}
	return startContainerShards(ctx, n, false)
}

// startContainerShards starts n shard containers; withRouter also requires the router image,
// so that an Env fails before it starts anything.
func startContainerShards(ctx context.Context, n int, withRouter bool) (*ShardSet, error) {
	if err := dockerAvailable(ctx, withRouter); err != nil {
		return nil, unavailable(ctx, Docker, err, withRouter)
	}
	b, err := containers()
	if err != nil {
		return nil, err
	}
	c, err := b.StartShards(ctx, n)
	if err != nil {
		return nil, err
	}
	return &ShardSet{Backend: Docker, Shards: c.Shards(), cluster: c, closers: []func() error{c.Close}}, nil
}

// DSNs are the shards' connection URLs from the host, in shard order.
func (s *ShardSet) DSNs() []string {
	out := make([]string, len(s.Shards))
	for i, sh := range s.Shards {
		out[i] = sh.DSN()
	}
	return out
}

// Shard returns the shard named name, or nil.
func (s *ShardSet) Shard(name string) Shard {
	for _, sh := range s.Shards {
		if sh.Name() == name {
			return sh
		}
	}
	return nil
}

// Cluster returns the containers of the Docker backend, nil on the local backend. For the
// faults only containers have (cutting a shard off the network), containers.ClusterOf gives
// their own type.
func (s *ShardSet) Cluster() ContainerShards { return s.cluster }

// Close stops every shard and removes its data. Closing twice is harmless.
func (s *ShardSet) Close() error {
	var errs []error
	for _, c := range s.closers {
		errs = append(errs, c())
	}
	s.closers = nil
	return errors.Join(errs...)
}
