// Package topology turns a shard map and the pool settings of router.yaml into connections: one
// pgx pool per shard, every one built by the same function with the same defaults and session
// settings, for serve, migrate, maintain, apply, dev and the tests alike. A Topology is
// immutable: a reload opens a new one that reuses the pools of unchanged shards, and the old one
// closes its other pools once its last user has left.
package topology

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/dsn"
	"github.com/shardgate/shardgate/shardmap"
)

// Topology is one shard map with an open pool per shard. It is immutable once built: a reload
// builds a new Topology and swaps it in, so a request keeps the map it started with.
type Topology struct {
	Map    *shardmap.Map
	shards map[string]*Shard

	// Requests hold the topology while they use its pools; a retired topology takes no new
	// users and closes its own pools only after the last user left.
	ids *identities // what each shard's connections found it to be, shared along reloads

	mu      sync.Mutex
	users   int
	retired bool
	idle    chan struct{}
}

// Hold registers a user of t's pools; false means t is retired and the caller must load the
// current topology again.
func (t *Topology) Hold() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.retired {
		return false
	}
	t.users++
	return true
}

// Release ends a use begun by Hold.
func (t *Topology) Release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.users--
	if t.retired && t.users == 0 {
		close(t.idle)
	}
}

// Retire waits until no user holds t, then closes the pools that next does not share.
func (t *Topology) Retire(next *Topology) {
	t.mu.Lock()
	t.retired = true
	if t.users == 0 {
		close(t.idle)
	}
	t.mu.Unlock()
	<-t.idle
	t.closeNotIn(next)
}

// Shard is how requests reach one shard: its pool, and slots bounding how many requests may
// use or wait for it at once, so a saturated shard sheds load with a prompt error instead of
// queueing without bound. A reload that keeps the shard keeps its Shard.
type Shard struct {
	Pool  *pgxpool.Pool
	slots chan struct{}
	state *shardState
}

// ErrShardBusy means every slot of the shard is taken.
var ErrShardBusy = errors.New("shard busy: all connections in use and the wait queue is full")

// Enter takes a slot or fails at once with ErrShardBusy; Leave gives it back.
func (c *Shard) Enter() error {
	select {
	case c.slots <- struct{}{}:
		return nil
	default:
		return ErrShardBusy
	}
}

// Leave gives back the slot taken by Enter.
func (c *Shard) Leave() { <-c.slots }

// Shard returns the named shard's connections, or nil.
func (t *Topology) Shard(name string) *Shard { return t.shards[name] }

// Pool returns the pool of the named shard, or nil.
func (t *Topology) Pool(shard string) *pgxpool.Pool {
	if c := t.shards[shard]; c != nil {
		return c.Pool
	}
	return nil
}

// Open opens a pool for every shard of m. Pools of prev whose shard keeps its name and DSN are
// reused rather than reopened. Opening does not connect: a shard that is down makes its own
// requests fail, not the router's start-up.
func Open(m *shardmap.Map, prev *Topology, sp config.ShardPool) (*Topology, error) {
	t := &Topology{
		Map:    m,
		shards: make(map[string]*Shard, len(m.Shards)),
		idle:   make(chan struct{}),
		ids:    newIdentities(),
	}
	if prev != nil {
		t.ids = prev.ids
	}
	for _, s := range m.Shards {
		if prev != nil {
			if old := prev.Map.Shard(s.Name); old != nil && old.DSN == s.DSN {
				t.shards[s.Name] = prev.shards[s.Name]
				continue
			}
		}
		state := newShardState(s.Name, t.ids)
		pool, err := openPool(s, sp, state)
		if err != nil {
			t.closeNotIn(prev)
			return nil, err
		}
		t.shards[s.Name] = &Shard{Pool: pool, slots: make(chan struct{}, int(pool.Config().MaxConns)+sp.MaxWaiting), state: state}
	}
	return t, nil
}

// OpenForCommand is Open for the one-shot commands that work on every shard (migrate, maintain,
// shardmap apply): each pool has at least 4 connections whatever serve's max_conns, because an
// apply holds one per shard for its lock while it copies over others.
func OpenForCommand(m *shardmap.Map, sp config.ShardPool) (*Topology, error) {
	sp.MaxConns = max(sp.MaxConns, 4)
	return Open(m, nil, sp)
}

// OpenPool opens the pool of one shard. It is the only place pool defaults live: max_conns and
// connect_timeout from router.yaml unless the DSN sets pool_max_conns or connect_timeout itself,
// an application_name unless the DSN names one, READ COMMITTED pinned for every session,
// which the transfer functions rely on (a fresh snapshot after its key lock) whatever the
// database's default is, and the settings of sp.Session.
//
// A query whose context ends closes its connection and no cancel request is ever sent (see
// closeOnCancel and noCancelRequests), and the server ends a statement whose client went away within a second
// (client_connection_check_interval), so a statement stuck on a lock still ends on the server
// while a commit waiting for its synchronous standby keeps waiting.
func OpenPool(s shardmap.Shard, sp config.ShardPool) (*pgxpool.Pool, error) {
	return openPool(s, sp, newShardState(s.Name, nil))
}

// openPool is OpenPool recording what each new connection learns about the shard in state.
func openPool(s shardmap.Shard, sp config.ShardPool, state *shardState) (*pgxpool.Pool, error) {
	cfg, err := dsn.PoolConfig(s.DSN)
	if err != nil {
		return nil, fmt.Errorf("shard %s: dsn: %w", s.Name, err)
	}
	if _, set := dsn.Setting(s.DSN, "pool_max_conns"); !set {
		cfg.MaxConns = sp.MaxConns
	}
	if _, set := dsn.Setting(s.DSN, "connect_timeout"); !set {
		cfg.ConnConfig.ConnectTimeout = sp.ConnectTimeout
	}
	cfg.MaxConnIdleTime = 5 * time.Minute
	cfg.HealthCheckPeriod = 15 * time.Second
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "shardgate"
	}
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
	for k, v := range sp.Session {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["client_connection_check_interval"]; !ok {
		cfg.ConnConfig.RuntimeParams["client_connection_check_interval"] = "1000"
	}
	cfg.ConnConfig.BuildContextWatcherHandler = closeOnCancel
	cfg.BeforeConnect = noCancelRequests
	cfg.ConnConfig.OnNotice = watcher.onNotice
	cfg.ConnConfig.Tracer = watcher
	cfg.AfterConnect = state.afterConnect
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("shard %s: %w", s.Name, err)
	}
	return pool, nil
}

// closeNotIn closes the pools of t that other does not share. It blocks until their acquired
// connections are released, so in-flight requests on them finish first.
func (t *Topology) closeNotIn(other *Topology) {
	for name, c := range t.shards {
		if other != nil && other.shards[name] == c {
			continue
		}
		c.Pool.Close()
	}
}

// Close closes every pool, waiting for in-flight use to end.
func (t *Topology) Close() { t.closeNotIn(nil) }

// Each calls fn with the name and connections of every shard, for collectors.
func (t *Topology) Each(fn func(name string, s *Shard)) {
	for name, s := range t.shards {
		fn(name, s)
	}
}
