package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/partition"
)

// EnsurePartitions makes sure the partitions holding now and the next ahead intervals are
// attached, each with its unique (scope, key) index, and returns the names of those it created
// or attached again, in time order.
//
// A partition is created as a plain table and then attached, because ATTACH PARTITION takes only
// SHARE UPDATE EXCLUSIVE on idempotency_record, which does not block transfers, where CREATE
// TABLE ... PARTITION OF would take ACCESS EXCLUSIVE. A CHECK constraint matching the bounds
// lets ATTACH skip its validation scan. Concurrent callers are serialized by an advisory lock.
//
// A table that already bears a needed partition's name but is not attached (detached by hand,
// say) is attached again rather than replaced: the keys it holds are younger than any retention
// and must go on blocking duplicates.
func EnsurePartitions(ctx context.Context, pool *pgxpool.Pool, iv partition.Interval, now time.Time, ahead int) ([]string, error) {
	created, reattached, err := ensurePartitions(ctx, pool, iv, now, ahead)
	if err != nil {
		return nil, err
	}
	names := slices.Concat(created, reattached)
	slices.Sort(names) // the names sort in time order
	return names, nil
}

// txStarter is a pool, or the one connection Upkeep holds its session lock on.
type txStarter interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ensurePartitions is EnsurePartitions on db; it reports created and re-attached partitions apart.
func ensurePartitions(ctx context.Context, db txStarter, iv partition.Interval, now time.Time, ahead int) (created, reattached []string, err error) {
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		created, reattached = nil, nil
		// Re-entrant: Upkeep already holds this lock as a session lock on the same connection.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", LockClass, LockUpkeep); err != nil {
			return err
		}
		existing, err := attachedPartitions(ctx, tx)
		if err != nil {
			return err
		}
		t := now
		for i := 0; i <= ahead; i++ {
			p := partition.At(iv, t)
			t = p.To
			if existing[p.Name] {
				continue
			}
			detached, err := detachedTable(ctx, tx, p.Name)
			if err != nil {
				return err
			}
			if detached != 0 {
				if err := reattachPartition(ctx, tx, p, detached); err != nil {
					return fmt.Errorf("attach existing table %s again: %w", p.Name, err)
				}
				reattached = append(reattached, p.Name)
				continue
			}
			if err := createPartition(ctx, tx, p); err != nil {
				return fmt.Errorf("create partition %s: %w", p.Name, err)
			}
			created = append(created, p.Name)
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	return created, reattached, nil
}

func attachedPartitions(ctx context.Context, tx pgx.Tx) (map[string]bool, error) {
	rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		WHERE i.inhparent = 'idempotency_record'::regclass`)
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	set := make(map[string]bool, len(names))
	for _, n := range names {
		set[n] = true
	}
	return set, nil
}

func createPartition(ctx context.Context, tx pgx.Tx, p partition.Partition) error {
	name := pgx.Identifier{p.Name}.Sanitize()
	from, to := p.From.Format(time.RFC3339), p.To.Format(time.RFC3339)
	stmts := []string{
		fmt.Sprintf(`CREATE TABLE %s (LIKE idempotency_record INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`, name),
		fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s UNIQUE (scope, key)`, name, pgx.Identifier{p.Name + "_scope_key"}.Sanitize()),
		fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT bounds CHECK (created_at >= '%s' AND created_at < '%s')`, name, from, to),
		fmt.Sprintf(`ALTER TABLE idempotency_record ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`, name, from, to),
		fmt.Sprintf(`ALTER TABLE %s DROP CONSTRAINT bounds`, name),
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// detachedTable returns the oid of a plain table named name beside idempotency_record that is
// no partition, or 0 when there is no relation of that name. Any other relation of that name is
// an error, since a partition cannot then be created.
func detachedTable(ctx context.Context, tx pgx.Tx, name string) (uint32, error) {
	var (
		oid         uint32
		kind        string
		isPartition bool
	)
	err := tx.QueryRow(ctx, `SELECT c.oid, c.relkind::text, c.relispartition FROM pg_class c
		WHERE c.relname = $1 AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'idempotency_record'::regclass)`,
		name).Scan(&oid, &kind, &isPartition)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, nil
	case err != nil:
		return 0, err
	case kind != "r" || isPartition:
		return 0, fmt.Errorf("relation %s exists but is not a detached idempotency_record partition (relkind %s, partition %t); rename or drop it so that upkeep can create the partition", name, kind, isPartition)
	}
	return oid, nil
}

// reattachPartition attaches the existing table oid as partition p, first giving it the unique
// (scope, key) index every partition has and idempotency_record's CHECKs if it lacks them. ATTACH
// checks that the table's columns match and that every row lies within p. A table whose copy of
// the key-floor rule is NOT VALID stays in every lookup (keepUnchecked) until upkeep brings it
// under the rule.
func reattachPartition(ctx context.Context, tx pgx.Tx, p partition.Partition, oid uint32) error {
	var hasUnique bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (
		SELECT 1 FROM pg_index i
		 WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
		   AND ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
		              JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		             ORDER BY k.ord) = ARRAY['scope', 'key'])`, oid).Scan(&hasUnique); err != nil {
		return err
	}
	name := pgx.Identifier{p.Name}.Sanitize()
	if !hasUnique {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s UNIQUE (scope, key)`, name, pgx.Identifier{p.Name + "_scope_key"}.Sanitize())); err != nil {
			return err
		}
	}
	// ATTACH wants every CHECK of idempotency_record on the table. One detached before a
	// migration added a CHECK (0006's, NOT VALID) lacks it: it gets the parent's, as the parent
	// has it, so a NOT VALID one does not read rows written before it.
	rows, err := tx.Query(ctx, `SELECT c.conname::text, pg_get_constraintdef(c.oid) FROM pg_constraint c
		WHERE c.conrelid = 'idempotency_record'::regclass AND c.contype = 'c'
		  AND NOT EXISTS (SELECT 1 FROM pg_constraint t WHERE t.conrelid = $1 AND t.contype = 'c' AND t.conname = c.conname)`, oid)
	if err != nil {
		return err
	}
	missing, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (c [2]string, err error) {
		err = r.Scan(&c[0], &c[1])
		return c, err
	})
	if err != nil {
		return err
	}
	for _, c := range missing {
		if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT %s %s`, name, pgx.Identifier{c[0]}.Sanitize(), c[1])); err != nil {
			return fmt.Errorf("give %s the CHECK %s of idempotency_record: %w", p.Name, c[0], err)
		}
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(`ALTER TABLE idempotency_record ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')`,
		name, p.From.Format(time.RFC3339), p.To.Format(time.RFC3339))); err != nil {
		return err
	}
	return keepUnchecked(ctx, tx, oid, p.To)
}
