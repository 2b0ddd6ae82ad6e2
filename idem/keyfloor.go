package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// keyFloorRule is migration 0006's CHECK on idempotency_record: no record is dated before its
// key's floor (shardgate_key_floor, the time a UUIDv7 key carries).
const keyFloorRule = "idempotency_record_not_before_key_floor"

// ruleCatchUpBudget is how long one upkeep pass goes on bringing old partitions under the
// key-floor rule: it finishes the partition it is on, and the next pass goes on from there.
const ruleCatchUpBudget = time.Minute

// readUncheckedBefore returns shardgate_record_floor.unchecked_before: records dated before it
// may predate their key's floor, so every lookup reads the partitions that begin before it. ok is
// false on a shard without migration 0006, where every lookup reads every partition.
func readUncheckedBefore(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (at time.Time, ok bool, err error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('shardgate_record_floor') IS NOT NULL").Scan(&exists); err != nil || !exists {
		return time.Time{}, false, err
	}
	var u pgtype.Timestamptz
	if err := q.QueryRow(ctx, "SELECT unchecked_before FROM shardgate_record_floor").Scan(&u); err != nil {
		return time.Time{}, false, fmt.Errorf("read shardgate_record_floor: %w", err)
	}
	if u.InfinityModifier != pgtype.Finite {
		return time.Time{}, false, fmt.Errorf("shardgate_record_floor.unchecked_before is %v; upkeep keeps it a partition bound", u.InfinityModifier)
	}
	return u.Time, true, nil
}

// bringUnderRule lowers unchecked_before past the partitions that begin before it, newest first,
// so that a shard upgraded to migration 0006 prunes its lookups within a few passes instead of
// once retention has dropped every partition it had then. For each partition whose copy of the
// rule is NOT VALID (it held records before the rule existed, or was attached again without the
// rule), in one transaction:
//
//   - every record in it dated before its key's floor (written before 0006, by a client whose
//     clock ran ahead of the shard's) is dated at its floor instead, as 0006's writers date new
//     ones: a moment later, which at most moves it into the next partition and keeps it that much
//     longer;
//   - ALTER TABLE ... VALIDATE CONSTRAINT has PostgreSQL check the rule over the whole partition;
//   - unchecked_before becomes the partition's lower bound.
//
// All three commit together, so a lookup that reads the lowered bound also sees the records as
// dated now. A partition already under the rule (created since 0006) only moves the bound. The
// locks are ROW EXCLUSIVE and, on the one partition, SHARE UPDATE EXCLUSIVE: transfers go on. It
// stops at a partition detached half-way or without finite bounds, and after ruleCatchUpBudget.
func (u *upkeeper) bringUnderRule(ctx context.Context) error {
	unchecked, ok, err := readUncheckedBefore(ctx, u.conn)
	if err != nil || !ok {
		return err
	}
	parts, err := listPartitions(ctx, u.conn)
	if err != nil {
		return err
	}
	start := time.Now()
	for i := len(parts) - 1; i >= 0; i-- {
		p := parts[i]
		if p.bounded && !p.pending && !p.From.Before(unchecked) {
			continue // wholly under the rule already
		}
		if !p.bounded || p.pending || time.Since(start) > ruleCatchUpBudget {
			return nil
		}
		if err := pgx.BeginFunc(ctx, u.conn, func(tx pgx.Tx) error { return underRule(ctx, tx, p) }); err != nil {
			return fmt.Errorf("bring partition %s under the key-floor rule (%s): %w", p.Name, keyFloorRule, err)
		}
		unchecked = p.From
		u.rep.Checked = append(u.rep.Checked, p.Name)
	}
	return nil
}

// underRule dates p's rule-breaking records at their keys' floors, validates p's copy of the
// rule, and takes p out of unchecked_before, in tx.
func underRule(ctx context.Context, tx pgx.Tx, p catalogPartition) error {
	table := pgx.Identifier{p.schema, p.Name}.Sanitize()
	var valid bool
	if err := tx.QueryRow(ctx, "SELECT convalidated FROM pg_constraint WHERE conrelid = $1::regclass AND conname = $2",
		table, keyFloorRule).Scan(&valid); err != nil {
		return fmt.Errorf("read the partition's copy of the rule: %w", err)
	}
	if !valid {
		// Through the parent, so that a record whose floor lies in the next partition moves there.
		if _, err := tx.Exec(ctx, `UPDATE idempotency_record SET created_at = shardgate_key_floor(key)
			WHERE created_at >= $1 AND created_at < $2 AND created_at < shardgate_key_floor(key)`, p.From, p.To); err != nil {
			return fmt.Errorf("date its records at their keys' floors: %w", err)
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s VALIDATE CONSTRAINT %s", table, pgx.Identifier{keyFloorRule}.Sanitize())); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, "UPDATE shardgate_record_floor SET unchecked_before = $1 WHERE unchecked_before > $1", p.From)
	return err
}

// keepUnchecked keeps the table oid, attached in tx as a partition ending at to, in every lookup
// when its copy of the rule is NOT VALID: its records may predate their keys' floors until
// upkeep brings it under the rule.
func keepUnchecked(ctx context.Context, tx pgx.Tx, oid uint32, to time.Time) error {
	var valid bool
	err := tx.QueryRow(ctx, "SELECT convalidated FROM pg_constraint WHERE conrelid = $1 AND conname = $2", oid, keyFloorRule).Scan(&valid)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil // a shard before migration 0006: every lookup reads every partition
	case err != nil || valid:
		return err
	}
	_, err = tx.Exec(ctx, "UPDATE shardgate_record_floor SET unchecked_before = $1 WHERE unchecked_before < $1", to)
	return err
}
