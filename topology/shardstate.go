package topology

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// watcher is every pool's commit watcher: the notice handler and the tracer it hooks into are
// per connection config, and one shared watcher keeps its map keyed by connection.
var watcher = new(commitWatcher)

// shardState is what the connections of one shard's pool learn as they connect.
type shardState struct {
	name         string
	ids          *identities // shared by the topologies of one router
	syncStandbys atomic.Bool // synchronous_standby_names is set and this session's commits wait
}

func newShardState(name string, ids *identities) *shardState {
	if ids == nil {
		ids = newIdentities()
	}
	return &shardState{name: name, ids: ids}
}

// syncSQL reads whether a commit of this session waits for synchronous standbys: some are named,
// and synchronous_commit is on, remote_write or remote_apply (local and off do not wait).
const syncSQL = `SELECT current_setting('synchronous_standby_names') <> ''
	AND current_setting('synchronous_commit') NOT IN ('local', 'off')`

// afterConnect reads, once per new connection, whether the shard waits for synchronous
// standbys, and which database it is (a changed identity is reported to the subscribers).
// A role not allowed to read the control data (pg_control_system) still connects; the shard's
// identity is then not watched.
func (st *shardState) afterConnect(ctx context.Context, c *pgx.Conn) error {
	var waits bool
	if err := c.QueryRow(ctx, syncSQL).Scan(&waits); err != nil {
		return fmt.Errorf("read synchronous_standby_names: %w", err)
	}
	st.syncStandbys.Store(waits)
	id, err := readIdentity(ctx, c)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return nil
	case err != nil:
		return err
	}
	st.ids.observe(st.name, id)
	return nil
}

// SyncStandbys reports whether the shard's primary had synchronous standbys configured, and the
// router's sessions wait for them, when its latest connection was made.
func (c *Shard) SyncStandbys() bool { return c.state != nil && c.state.syncStandbys.Load() }

// confirmSQL writes a transactional WAL record (a logical decoding message, which nothing
// reads) and commits, so that the commit waits for the synchronous standbys: every commit before
// it in WAL is then on them too. A transaction that only takes an xid (pg_current_xact_id())
// does not do: PostgreSQL skips the wait for a transaction that wrote no WAL before its commit
// record.
const confirmSQL = "SELECT pg_logical_emit_message(true, 'shardgate', 'replicated')"

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
