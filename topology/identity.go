package topology

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Identity is which database a shard's primary is: its cluster's system identifier, which
// pg_basebackup copies to a standby, and its timeline, which a promotion (or a point-in-time
// restore) moves to a new number. Two connections that see the same Identity reach the same
// history of commits; a changed Identity under the same shard name means commits the router saw
// acknowledged may be missing (a failover to a standby that lacked them, a restore from backup).
type Identity struct {
	SystemID uint64
	Timeline uint32
}

func (id Identity) String() string {
	return strconv.FormatUint(id.SystemID, 10) + "/" + strconv.FormatUint(uint64(id.Timeline), 10)
}

// IdentityChange is a shard whose connections now reach a database other than the one they
// reached before.
type IdentityChange struct {
	Shard    string
	Old, New Identity
}

// identitySQL reads the identity of the server a connection reached. The timeline is read from
// the name of the WAL file being written, which moves at once on promotion (the last
// checkpoint's timeline moves only once the first checkpoint after it ends); a server in recovery
// writes no WAL and reports its last checkpoint's timeline instead.
const identitySQL = `SELECT (SELECT system_identifier FROM pg_control_system()),
	CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())::bigint
	     ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint END`

// readIdentity reads the identity of the server c is connected to.
func readIdentity(ctx context.Context, c *pgx.Conn) (Identity, error) {
	var sys, tli int64
	if err := c.QueryRow(ctx, identitySQL).Scan(&sys, &tli); err != nil {
		return Identity{}, fmt.Errorf("read the server's identity: %w", err)
	}
	return Identity{SystemID: uint64(sys), Timeline: uint32(tli)}, nil
}

// identities is what the topologies of one router know of each shard's identity, by shard
// name: a reload that repoints a shard (a new DSN after a failover) opens a new pool, and the
// identity its first connection reads is compared with what the old pool's connections read.
type identities struct {
	mu      sync.Mutex
	byShard map[string]Identity
	subs    []func(IdentityChange)
}

func newIdentities() *identities { return &identities{byShard: map[string]Identity{}} }

// observe records what a new connection of shard read, and calls the subscribers when it
// differs from what the shard's connections read before.
func (ids *identities) observe(shard string, id Identity) {
	ids.mu.Lock()
	old, known := ids.byShard[shard]
	ids.byShard[shard] = id
	subs := ids.subs
	ids.mu.Unlock()
	if !known || old == id {
		return
	}
	for _, f := range subs {
		f(IdentityChange{Shard: shard, Old: old, New: id})
	}
}

// OnIdentityChange makes every new connection of t, and of the topologies later opened from it,
// call f when the shard it connects to is no longer the database the shard's connections reached
// before (a promoted standby, a restore). f runs on the connecting goroutine before the
// connection serves anything, so it must not block; it sees each change once.
func (t *Topology) OnIdentityChange(f func(IdentityChange)) {
	t.ids.mu.Lock()
	defer t.ids.mu.Unlock()
	t.ids.subs = append(t.ids.subs, f)
}

// Identity returns the identity the named shard's latest new connection read, and whether one
// has connected yet.
func (t *Topology) Identity(shard string) (Identity, bool) {
	t.ids.mu.Lock()
	defer t.ids.mu.Unlock()
	id, ok := t.ids.byShard[shard]
	return id, ok
}
