package topology

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// watcher is every pool's commit watcher: the notice handler and the tracer it hooks into are
// per connection config, and one shared watcher keeps its map keyed by connection.
var watcher = new(commitWatcher)

// shardState is what the connections of one shard's pool learn as they connect.
type shardState struct {
	syncStandbys atomic.Bool // synchronous_standby_names is set
}

// afterConnect reads, once per new connection, whether the shard waits for synchronous
// standbys.
func (st *shardState) afterConnect(ctx context.Context, c *pgx.Conn) error {
	var names string
	if err := c.QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&names); err != nil {
		return fmt.Errorf("read synchronous_standby_names: %w", err)
	}
	st.syncStandbys.Store(names != "")
	return nil
}

// SyncStandbys reports whether the shard's primary had synchronous standbys configured when its
// latest connection was made.
func (c *Shard) SyncStandbys() bool { return c.state != nil && c.state.syncStandbys.Load() }

// confirmSQL assigns a transaction id and commits, so that its commit record is written to WAL
// and, on a shard with synchronous standbys, waits until they have it: every commit before it
// in WAL is then on the standby too.
const confirmSQL = "SELECT pg_current_xact_id()"

// ConfirmReplicated returns once every transaction the shard committed before the call is on
// its synchronous standbys, or ErrNotReplicated (or a connection error) when that is not known.
// On a shard without synchronous standbys it returns nil at once: there is nothing to wait for,
// and a failover to an asynchronous standby can lose commits whatever the router does.
func (c *Shard) ConfirmReplicated(ctx context.Context) error {
	if !c.SyncStandbys() {
		return nil
	}
	ctx, check := WatchCommits(ctx)
	if _, err := c.Pool.Exec(ctx, confirmSQL); err != nil {
		return fmt.Errorf("confirm replication: %w", err)
	}
	return check()
}
