package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/shardmap"
)

// Topology is one shard map with an open pool per shard. It is immutable once built: a reload
// builds a new Topology and swaps it in, so a request keeps the map it started with.
type Topology struct {
	Map    *shardmap.Map
	shards map[string]*shardConn

	// Requests hold the topology while they use its pools; a retired topology takes no new
	// users and closes its own pools only after the last user left.
	mu      sync.Mutex
	users   int
	retired bool
	idle    chan struct{}
}

// hold registers a user of t's pools; false means t is retired and the caller must load the
// current topology again.
func (t *Topology) hold() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.retired {
		return false
	}
	t.users++
	return true
}

// release ends a use begun by hold.
func (t *Topology) release() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.users--
	if t.retired && t.users == 0 {
		close(t.idle)
	}
}

// retire waits until no request uses t, then closes the pools that next does not share.
func (t *Topology) retire(next *Topology) {
	t.mu.Lock()
	t.retired = true
	if t.users == 0 {
		close(t.idle)
	}
	t.mu.Unlock()
	<-t.idle
	t.closeNotIn(next)
}

// shardConn is how requests reach one shard: its pool, and slots bounding how many requests
// may use or wait for it at once, so a saturated shard sheds load with a prompt 503 instead of
// queueing without bound. A reload that keeps the shard keeps its shardConn.
type shardConn struct {
	pool  *pgxpool.Pool
	slots chan struct{}
}

// errShardBusy means every slot of the shard is taken.
var errShardBusy = errors.New("shard busy: all connections in use and the wait queue is full")

// enter takes a slot or fails at once with errShardBusy; leave gives it back.
func (c *shardConn) enter() error {
	select {
	case c.slots <- struct{}{}:
		return nil
	default:
		return errShardBusy
	}
}

func (c *shardConn) leave() { <-c.slots }

// Pool returns the pool of the named shard, or nil.
func (t *Topology) Pool(shard string) *pgxpool.Pool {
	if c := t.shards[shard]; c != nil {
		return c.pool
	}
	return nil
}

// OpenTopology opens a pool for every shard of m. Pools of prev whose shard keeps its name and
// DSN are reused rather than reopened. Opening does not connect: a shard that is down makes its
// own requests fail with 503, not the router's start-up.
func OpenTopology(m *shardmap.Map, prev *Topology, sp config.ShardPool) (*Topology, error) {
	t := &Topology{
		Map:    m,
		shards: make(map[string]*shardConn, len(m.Shards)),
		idle:   make(chan struct{}),
	}
	for _, s := range m.Shards {
		if prev != nil {
			if old := prev.Map.Shard(s.Name); old != nil && old.DSN == s.DSN {
				t.shards[s.Name] = prev.shards[s.Name]
				continue
			}
		}
		pool, err := openPool(s, sp)
		if err != nil {
			t.closeNotIn(prev)
			return nil, err
		}
		t.shards[s.Name] = &shardConn{pool: pool, slots: make(chan struct{}, int(sp.MaxConns)+sp.MaxWaiting)}
	}
	return t, nil
}

func openPool(s shardmap.Shard, sp config.ShardPool) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(s.DSN)
	if err != nil {
		// pgx's parse errors quote the DSN with a best-effort redaction that
		// misses some libpq spellings, so scrub the text with our own parser.
		return nil, fmt.Errorf("shard %s: dsn: %s", s.Name, s.Scrub(err.Error()))
	}
	cfg.MaxConns = sp.MaxConns
	cfg.MaxConnIdleTime = 5 * time.Minute
	cfg.HealthCheckPeriod = 15 * time.Second
	cfg.ConnConfig.ConnectTimeout = sp.ConnectTimeout
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = "shardgate"
	}
	// shardgate_transfer relies on READ COMMITTED (a fresh snapshot after its key lock); a
	// database default of REPEATABLE READ must not change that.
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "read committed"
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
		c.pool.Close()
	}
}

// Close closes every pool, waiting for in-flight use to end.
func (t *Topology) Close() { t.closeNotIn(nil) }
