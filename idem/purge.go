package idem

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// purgeTables are the tables a range's rows live in, each with the columns (after keyspace_id)
// that order its rows in its keyspace index: the order in which a purge deletes them.
var purgeTables = []struct {
	table string
	keys  []string // after keyspace_id
	casts []string
}{
	{"idempotency_record", []string{"scope", "key"}, []string{"text", "text"}},
	{"ledger_entries", []string{"id"}, []string{"bigint"}},
	{"shardgate_credit_outbox", []string{"transfer_id"}, []string{"text"}},
}

// heldHere is true for a row whose keyspace_id lies in any range this shard lists (active,
// moving or copied): a purge leaves those rows alone, whatever the purge list says.
const heldHere = `EXISTS (SELECT 1 FROM shardgate_owned_range o
	WHERE t.keyspace_id >= o.lo AND (o.hi IS NULL OR t.keyspace_id < o.hi))`

// queuePurge lists every inactive range (moving or copied) that no active range covers as a
// range to purge, and forgets the moves out of ranges this shard no longer owns with their
// captured changes: the settle of an apply, in its transaction.
func queuePurge(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `INSERT INTO shardgate_range_purge (key_range, lo, hi)
		SELECT key_range, lo, hi FROM shardgate_owned_range WHERE NOT active
		ON CONFLICT (key_range) DO NOTHING`); err != nil {
		return fmt.Errorf("list moved ranges to purge: %w", err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM shardgate_range_move m WHERE NOT EXISTS (SELECT 1 FROM shardgate_owned_range o
		WHERE o.active AND o.lo <= m.lo AND (o.hi IS NULL OR (m.hi IS NOT NULL AND m.hi <= o.hi)))`); err != nil {
		return fmt.Errorf("forget finished moves: %w", err)
	}
	_, err := tx.Exec(ctx, `DELETE FROM shardgate_range_change c WHERE NOT EXISTS (SELECT 1 FROM shardgate_range_move m
		WHERE c.keyspace_id >= m.lo AND (m.hi IS NULL OR c.keyspace_id < m.hi))`)
	if err != nil {
		return fmt.Errorf("forget the changes of finished moves: %w", err)
	}
	return nil
}

// PurgeMoved deletes, in transactions of at most batch rows each, the rows of ranges that moved
// away from the shard behind pool (their new owners hold them), until none is left or ctx ends,
// and returns how many it deleted. Each transaction is short and takes no lock a transfer waits
// on (only row locks on the rows it deletes, which no transfer reads: they are outside every
// range the shard lists), so transfers of other ranges go on meanwhile. A row in a range the
// shard lists again (active, moving or copied) is kept. It can stop at any point and run again.
// After each transaction it pauses pace times as long as the transaction took (Nap), so that
// the purge leaves the shard's CPU to transfers; pace 0 does not pause.
func PurgeMoved(ctx context.Context, pool *pgxpool.Pool, batch int, pace float64) (int64, error) {
	if batch <= 0 {
		batch = 1000
	}
	var deleted int64
	rows, err := pool.Query(ctx, "SELECT key_range, lo, hi FROM shardgate_range_purge ORDER BY lo")
	if err != nil {
		return 0, err
	}
	var ranges []purgeRange
	var p purgeRange
	if _, err := pgx.ForEachRow(rows, []any{&p.name, &p.lo, &p.hi}, func() error { ranges = append(ranges, p); return nil }); err != nil {
		return 0, err
	}
	rows, err = pool.Query(ctx, "SELECT lo, hi FROM shardgate_owned_range")
	if err != nil {
		return 0, err
	}
	var held []purgeRange
	if _, err := pgx.ForEachRow(rows, []any{&p.lo, &p.hi}, func() error { held = append(held, p); return nil }); err != nil {
		return 0, err
	}
	for _, whole := range ranges {
		// Only the parts of the range that the shard lists nowhere: a batch then reads no row
		// it must keep (the check on each row below stays, for a range listed meanwhile).
		for _, r := range uncovered(whole, held) {
			if err := purgeOne(ctx, pool, r, batch, pace, &deleted); err != nil {
				return deleted, err
			}
		}
		if _, err := pool.Exec(ctx, "DELETE FROM shardgate_range_purge WHERE key_range = $1", whole.name); err != nil {
			return deleted, err
		}
	}
	return deleted, nil
}

// purgeRange is a range (signed keyspace bounds, hi nil for the end) to delete rows of.
type purgeRange struct {
	name string
	lo   int64
	hi   *int64
}

// uncovered returns the parts of r that none of held covers, in order.
func uncovered(r purgeRange, held []purgeRange) []purgeRange {
	held = slices.Clone(held)
	slices.SortFunc(held, func(a, b purgeRange) int { return cmp.Compare(a.lo, b.lo) })
	var out []purgeRange
	lo, open := r.lo, true // open: lo is where the part not yet covered begins
	for _, h := range held {
		if r.hi != nil && h.lo >= *r.hi {
			break
		}
		if h.hi != nil && *h.hi <= lo {
			continue
		}
		if h.lo > lo {
			end := h.lo
			out = append(out, purgeRange{name: r.name, lo: lo, hi: &end})
		}
		if h.hi == nil {
			open = false
			break
		}
		lo = max(lo, *h.hi)
	}
	if open && (r.hi == nil || lo < *r.hi) {
		out = append(out, purgeRange{name: r.name, lo: lo, hi: r.hi})
	}
	return out
}

// purgeOne deletes the rows of r, batch by batch, adding to deleted. Each batch goes on after
// the last row of the batch before it, in the table's keyspace index, and deletes up to its own
// last row by index range: no batch reads the rows (or the index entries) of those before.
// After each batch it pauses for pace times the batch's time.
func purgeOne(ctx context.Context, pool *pgxpool.Pool, r purgeRange, batch int, pace float64, deleted *int64) error {
	for _, t := range purgeTables {
		keys := strings.Join(t.keys, ", ")
		// row is the SQL row (keyspace_id, keys...) of parameters from $first on.
		row := func(first int) string {
			ps := []string{fmt.Sprintf("$%d::bigint", first)}
			for i, c := range t.casts {
				ps = append(ps, fmt.Sprintf("$%d::%s", first+1+i, c))
			}
			return "(" + strings.Join(ps, ", ") + ")"
		}
		var after []any // the last row deleted, nil before the first batch
		for {
			// Bounds of the range as literals: a parameter that may be NULL keeps the planner
			// from using them as index bounds.
			where := fmt.Sprintf("keyspace_id >= %d", r.lo)
			if r.hi != nil {
				where += fmt.Sprintf(" AND keyspace_id < %d", *r.hi)
			}
			var args []any
			if after != nil {
				where += fmt.Sprintf(" AND (keyspace_id, %s) > %s", keys, row(1))
				args = append(args, after...)
			}
			bound := make([]any, 1+len(t.keys))
			dest := make([]any, len(bound))
			for i := range bound {
				dest[i] = &bound[i]
			}
			var n int64
			began := time.Now()
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				// A batch is small: workers would cost more to start than they save.
				if _, err := tx.Exec(ctx, "SET LOCAL max_parallel_workers_per_gather = 0"); err != nil {
					return err
				}
				err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT * FROM (SELECT keyspace_id, %[2]s FROM %[1]s t WHERE %[3]s AND NOT %[4]s
					ORDER BY keyspace_id, %[2]s LIMIT %[5]d) b ORDER BY keyspace_id DESC, %[6]s LIMIT 1`,
					t.table, keys, where, heldHere, batch, strings.Join(t.keys, " DESC, ")+" DESC"), args...).Scan(dest...)
				if errors.Is(err, pgx.ErrNoRows) {
					bound = nil
					return nil
				}
				if err != nil {
					return err
				}
				tag, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %[1]s t WHERE %[2]s AND (keyspace_id, %[3]s) <= %[4]s AND NOT %[5]s`,
					t.table, where, keys, row(len(args)+1), heldHere), append(args, bound...)...)
				n = tag.RowsAffected()
				return err
			})
			if err != nil {
				return fmt.Errorf("purge %s of moved range %s: %w", t.table, r.name, err)
			}
			*deleted += n
			if bound == nil {
				break
			}
			after = bound
			if err := Nap(ctx, pace, began); err != nil {
				return err
			}
		}
	}
	return nil
}
