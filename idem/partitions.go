package idem

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Interval is how much time one idempotency_record partition covers.
type Interval int

// The partition intervals SPEC names: partitions idempotency_record_YYYY_MM_DD or _YYYY_MM.
const (
	Daily Interval = iota + 1
	Monthly
)

// String returns "daily" or "monthly".
func (iv Interval) String() string {
	switch iv {
	case Daily:
		return "daily"
	case Monthly:
		return "monthly"
	}
	return fmt.Sprintf("Interval(%d)", int(iv))
}

// Partition is one idempotency_record partition and the time range [From, To) it holds, in UTC.
type Partition struct {
	Name     string
	From, To time.Time
}

// PartitionAt returns the partition of interval iv that holds time t.
func PartitionAt(iv Interval, t time.Time) Partition {
	t = t.UTC()
	switch iv {
	case Monthly:
		from := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		return Partition{Name: from.Format("idempotency_record_2006_01"), From: from, To: from.AddDate(0, 1, 0)}
	default:
		from := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		return Partition{Name: from.Format("idempotency_record_2006_01_02"), From: from, To: from.AddDate(0, 0, 1)}
	}
}

// EnsurePartitions makes sure the partitions holding now and the next ahead intervals exist,
// each with its unique (scope, key) index, and returns the names of those it created.
//
// A partition is created as a plain table and then attached, because ATTACH PARTITION takes only
// SHARE UPDATE EXCLUSIVE on idempotency_record, which does not block transfers, where CREATE
// TABLE ... PARTITION OF would take ACCESS EXCLUSIVE. A CHECK constraint matching the bounds
// lets ATTACH skip its validation scan. Concurrent callers are serialized by an advisory lock.
func EnsurePartitions(ctx context.Context, pool *pgxpool.Pool, iv Interval, now time.Time, ahead int) ([]string, error) {
	var created []string
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", lockClass, lockUpkeep); err != nil {
			return err
		}
		existing, err := attachedPartitions(ctx, tx)
		if err != nil {
			return err
		}
		t := now
		for i := 0; i <= ahead; i++ {
			p := PartitionAt(iv, t)
			t = p.To
			if existing[p.Name] {
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
		return nil, err
	}
	return created, nil
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

func createPartition(ctx context.Context, tx pgx.Tx, p Partition) error {
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
