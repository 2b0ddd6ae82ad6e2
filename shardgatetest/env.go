package shardgatetest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/shardmap"
)

// DefaultClient names the one client an Env configures when Options.Clients is empty.
const DefaultClient = "test"

// Options configures an Env. The zero value is two shards splitting the keyspace evenly, one
// client with a random token, and the router's default retention.
type Options struct {
	// Backend chooses where shards and router run; empty: see [ChooseBackend].
	Backend Backend
	// Shards is the number of shards, at most MaxShards; default len(Ranges), else 2.
	Shards int
	// Ranges gives shard i the Vitess-style key ranges Ranges[i] ("-80", "80-c0", "c0-"); a
	// shard with none is drained. Together they must cover the keyspace exactly once. Default:
	// the keyspace split evenly on one-byte boundaries.
	Ranges [][]string
	// Clients maps each client's name (a-z 0-9 . _ -) to its bearer token; router.yaml gets the
	// tokens' SHA-256. Default: DefaultClient with a random token. See Env.Token.
	Clients map[string]string
	// Retention is idempotency.retention; default 720h.
	Retention time.Duration
	// ReplayWindow is idempotency.replay_window; default 168h, or Retention/2 if that is less.
	// The router refuses a retention under twice the replay window.
	ReplayWindow time.Duration
	// RouterYAML is more router.yaml, merged over what the package writes key by key, e.g.
	// "shard_pool:\n  request_timeout: 1s\n". It may not set listen, shardmap or auth.
	RouterYAML string
}

// withDefaults returns o with every default filled in, or says what is wrong with it.
func (o Options) withDefaults() (Options, error) {
	switch {
	case o.Shards == 0 && len(o.Ranges) == 0:
		o.Shards = 2
	case o.Shards == 0:
		o.Shards = len(o.Ranges)
	case len(o.Ranges) > 0 && len(o.Ranges) != o.Shards:
		return o, fmt.Errorf("shardgatetest: Options.Shards is %d but Options.Ranges lists %d shards: give one list of ranges per shard", o.Shards, len(o.Ranges))
	}
	if o.Shards < 1 || o.Shards > MaxShards {
		return o, fmt.Errorf("shardgatetest: Options.Shards is %d: use 1 to %d", o.Shards, MaxShards)
	}
	if len(o.Ranges) == 0 {
		o.Ranges = evenRanges(o.Shards)
	}
	if len(o.Clients) == 0 {
		o.Clients = map[string]string{DefaultClient: rand.Text()}
	} else {
		o.Clients = maps.Clone(o.Clients) // the Env's own: the caller may change its map
	}
	if o.Retention == 0 {
		o.Retention = 720 * time.Hour
	}
	if o.ReplayWindow == 0 {
		o.ReplayWindow = min(168*time.Hour, o.Retention/2)
	}
	return o, nil
}

// Env is a running shardgate: shards that are migrated, hold today's partitions and own their
// key ranges, and a router serving them at URL. Close stops it all.
type Env struct {
	// Backend is where it runs.
	Backend Backend
	// URL is the router's base URL, http://127.0.0.1:port.
	URL string
	// Shards are the shards, in the order of the shard map (shard-0 first).
	Shards []Shard
	// Map is the shard map the router serves, with the shards' DSNs as seen from the host.
	Map *shardmap.Map
	// Config is the router's configuration.
	Config *config.Config
	// Tokens maps each configured client's name to its bearer token.
	Tokens map[string]string
	// Token is the bearer token of the first client by name: with the default options, the
	// only one.
	Token string

	set     *ShardSet
	router  ContainerRouter // the Docker backend's router
	logs    *tailBuffer     // the local backend's router log
	closers []func() error  // run last to first by Close
}

// Start starts o.Shards shards and a router in front of them, on the backend o chooses, and
// returns once the router answers GET /readyz with 200. ctx bounds the start, not the Env's
// life; allow a minute or two for the Docker backend on a busy machine. On error, whatever was
// started is stopped; an error wrapping ErrNoBackend means neither backend can run here (see
// [CanSkip]).
func Start(ctx context.Context, o Options) (*Env, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	b, err := ChooseBackend(o.Backend)
	if err != nil {
		return nil, err
	}
	var set *ShardSet
	if b == Local {
		set, err = startLocalShards(ctx, o.Shards)
	} else {
		set, err = startContainerShards(ctx, o.Shards, true)
	}
	if err != nil {
		return nil, err
	}
	names := slices.Sorted(maps.Keys(o.Clients))
	e := &Env{Backend: b, Shards: set.Shards, Tokens: o.Clients, Token: o.Clients[names[0]], set: set, closers: []func() error{set.Close}}
	if b == Local {
		err = e.serveLocal(ctx, o)
	} else {
		err = e.serveDocker(ctx, o)
	}
	if err != nil {
		return nil, errors.Join(err, e.Close())
	}
	return e, nil
}

// prepare parses the router's configuration (router.yaml at cfgPath, listening on listen) and
// the shard map with the host DSNs, then does what `router migrate` does: migrations,
// partitions and range ownership on every shard. It returns router.yaml.
func (e *Env) prepare(ctx context.Context, o Options, cfgPath, listen string) ([]byte, error) {
	yml, err := routerYAML(o, listen)
	if err != nil {
		return nil, err
	}
	if e.Config, err = config.Parse(cfgPath, yml); err != nil {
		return nil, fmt.Errorf("shardgatetest: %w", err)
	}
	if e.Map, err = shardmap.Parse(e.Config.ShardmapPath, shardmapYAML(e.set.DSNs(), o.Ranges), nil); err != nil {
		return nil, fmt.Errorf("shardgatetest: Options.Ranges: %w", err)
	}
	if err := service.Migrate(ctx, e.Config, e.Map, io.Discard); err != nil {
		return nil, fmt.Errorf("shardgatetest: preparing the shards: %w", err)
	}
	return yml, nil
}

// serveDocker runs the router image as a container on the shards' network, with the same map
// naming the shards by their network aliases.
func (e *Env) serveDocker(ctx context.Context, o Options) error {
	yml, err := e.prepare(ctx, o, RouterConfigDir+"/router.yaml", "0.0.0.0:8080")
	if err != nil {
		return err
	}
	if e.router, err = e.set.Cluster().StartRouter(ctx, yml, func(dsns []string) []byte { return shardmapYAML(dsns, o.Ranges) }); err != nil {
		return err
	}
	e.URL = "http://" + e.router.Addr()
	return waitReady(ctx, e.URL, nil)
}

// DSNs are the shards' connection URLs from the host, in shard order.
func (e *Env) DSNs() []string { return e.set.DSNs() }

// ShardOf returns the shard that owns account's transfers (its source account's shard).
func (e *Env) ShardOf(account int64) Shard { return e.set.Shard(e.Map.Route(account).Shard) }

// Cluster returns the Docker backend's containers; nil on the local backend. containers.ClusterOf
// gives their own type, for faults only containers have: cutting a shard off the network.
func (e *Env) Cluster() ContainerShards { return e.set.Cluster() }

// RouterContainer returns the Docker backend's router; nil on the local backend.
// containers.RouterOf gives its own type, which can be killed and restarted.
func (e *Env) RouterContainer() ContainerRouter { return e.router }

// RouterLogs returns what the router has logged: the container's output on the Docker
// backend, the last MiB of the in-process router's log on the local one.
func (e *Env) RouterLogs(ctx context.Context) (string, error) {
	if e.router != nil {
		return e.router.Logs(ctx)
	}
	if e.logs == nil {
		return "", nil
	}
	return e.logs.String(), nil
}

// Close stops the router, then the shards, and removes their data. Closing twice is harmless.
func (e *Env) Close() error {
	var errs []error
	for i := len(e.closers) - 1; i >= 0; i-- {
		errs = append(errs, e.closers[i]())
	}
	e.closers = nil
	return errors.Join(errs...)
}
