package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// identityChanged marks dest for re-owing: its database is not the one the relay delivered to
// before (a promoted standby, a restore), and the credits delivered there most recently may be
// missing from it. The next pass re-owes them on every source shard.
func (r *Relay) identityChanged(c topology.IdentityChange) {
	if r.cfg.ReoweWindow <= 0 {
		return
	}
	r.mu.Lock()
	r.reowe[c.Shard] = true
	r.mu.Unlock()
	r.log.Warn("relay: a destination shard is another database than before; credits settled against it within relay.reowe_window are owed again and delivered once more",
		"shard", c.Shard, "old_identity", c.Old.String(), "new_identity", c.New.String(), "window", r.cfg.ReoweWindow.String())
	r.Notify()
}

// marked reports whether a destination waits to be re-owed.
func (r *Relay) marked() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reowe) > 0
}

// reoweMarked re-owes, on every source shard of topo, the credits settled within
// relay.reowe_window whose destination is a shard marked by identityChanged. A destination stays
// marked until every source shard has done it.
func (r *Relay) reoweMarked(ctx context.Context, topo *topology.Topology) {
	r.mu.Lock()
	var dests []string
	for d := range r.reowe {
		dests = append(dests, d)
	}
	r.mu.Unlock()
	for _, dest := range dests {
		done := true
		for _, src := range topo.Map.Shards {
			n, err := reowe(ctx, topo.Pool(src.Name), topo.Map, dest, r.cfg.ReoweWindow, r.timeout)
			if err != nil {
				done = false
				r.log.Warn("relay: could not re-owe credits settled against a shard whose identity changed; retried on the next pass",
					"from", src.Name, "to", dest, "err", scrub(topo, err))
				continue
			}
			r.metrics.reowed.WithLabelValues(dest).Add(float64(n))
			if n > 0 {
				r.log.Warn("relay: credits owed again after the destination's identity changed", "from", src.Name, "to", dest, "credits", n)
			}
		}
		if done {
			r.mu.Lock()
			delete(r.reowe, dest)
			r.mu.Unlock()
		}
	}
}

// reowe makes the rows of pool's outbox settled within window and owed to an account of dest
// (by m) owed again, due now, and returns how many. Delivering one again is safe: the credit's
// claim on dest is keyed by its transfer id, so a credit that is there replays.
func reowe(ctx context.Context, pool *pgxpool.Pool, m *shardmap.Map, dest string, window, timeout time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rows, err := pool.Query(ctx, `SELECT transfer_id, dst FROM shardgate_credit_outbox
		WHERE settled_at IS NOT NULL AND settled_at > now() - $1::interval`, window)
	if err != nil {
		return 0, err
	}
	var ids []string
	for rows.Next() {
		var id string
		var dst int64
		if err := rows.Scan(&id, &dst); err != nil {
			rows.Close()
			return 0, err
		}
		if s, _ := m.ShardFor(shardmap.KeyspaceID(dst)); s.Name == dest {
			ids = append(ids, id)
		}
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		return 0, nil
	}
	tag, err := pool.Exec(ctx, `UPDATE shardgate_credit_outbox
		SET settled_at = NULL, next_attempt_at = now(), attempts = 0, lease_owner = NULL, lease_until = NULL, last_error = NULL
		WHERE transfer_id = ANY($1) AND settled_at IS NOT NULL`, ids)
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}
