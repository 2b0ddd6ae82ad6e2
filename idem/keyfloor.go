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
// key-floor rule: it finishes the partition it is on, and the next pass goes on from there. Short,
// because the pass holds the shard's upkeep lock meanwhile, which a range move's copy waits for.
const ruleCatchUpBudget = 10 * time.Second

// maxEarlyBy is the most one partition may widen early_by by. early_by widens every lookup and
// is never lowered, so a partition whose records are dated earlier still before their keys (a
// clock far off) is left in every lookup instead, with those before it, until retention drops
// it. Clocks kept by NTP differ by milliseconds.
const maxEarlyBy = time.Hour

// farFuture stands for unchecked_before = 'infinity'.
var farFuture = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// readUncheckedBefore returns shardgate_record_floor.unchecked_before: records dated before it
// may predate their key's floor by any time (any other by at most early_by, migration 0007), so
// every lookup reads the partitions that begin before it. ok is false on a shard without
// migration 0006, where every lookup reads every partition.
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
	switch u.InfinityModifier {
	case pgtype.Infinity: // set by hand: every partition is read, as before 0006
		return farFuture, true, nil
	case pgtype.NegativeInfinity:
		return time.Date(1, 1, 2, 0, 0, 0, 0, time.UTC), true, nil
	}
	return u.Time, true, nil
}

// bringUnderRule lowers unchecked_before past the partitions that begin before it, newest first,
// so that a shard upgraded to migration 0006 prunes its lookups within a pass or a few instead of
// once retention has dropped every partition it had then (migration 0007). A partition whose copy
// of the rule is NOT VALID (it held records before the rule existed, or was attached again without
// it) is read once for how long before its key's floor its earliest-dated record is dated (a
// client clock ran ahead of the shard's); then, in one statement, early_by becomes at least
// that, and unchecked_before the partition's lower bound, so that a lookup reading the lowered
// bound reads the widened early_by with it, and finds every record where it is. A partition under
// the rule (created since 0006) only moves the bound; one whose records are dated more than
// maxEarlyBy early stops the walk. Nothing is rewritten, and only the read
// takes a lock (ACCESS SHARE on the one partition), so transfers and range moves go on. It stops
// at a partition detached half-way or without finite bounds, and after ruleCatchUpBudget. An
// error stops it too, as UpkeepReport.RuleHeld, not as a failure of the pass: until upkeep goes
// on, lookups read those partitions as they did before 0006.
func (u *upkeeper) bringUnderRule(ctx context.Context) {
	unchecked, ok, err := readUncheckedBefore(ctx, u.conn)
	if err == nil && ok {
		err = u.catchUp(ctx, unchecked)
	}
	if err != nil {
		u.rep.RuleHeld = err.Error()
	}
}

func (u *upkeeper) catchUp(ctx context.Context, unchecked time.Time) error {
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
		if err := u.underRule(ctx, p); err != nil {
			return fmt.Errorf("partition %s is not yet under the key-floor rule (%s), so every key lookup still reads it and those before it: %w", p.Name, keyFloorRule, err)
		}
		unchecked = p.From
		u.rep.Checked = append(u.rep.Checked, p.Name)
	}
	return nil
}

// underRule takes partition p out of unchecked_before, widening early_by to cover its records.
func (u *upkeeper) underRule(ctx context.Context, p catalogPartition) error {
	table := pgx.Identifier{p.schema, p.Name}.Sanitize()
	var valid bool
	if err := u.conn.QueryRow(ctx, "SELECT convalidated FROM pg_constraint WHERE conrelid = $1::regclass AND conname = $2",
		table, keyFloorRule).Scan(&valid); err != nil {
		return fmt.Errorf("read its copy of the rule: %w", err)
	}
	var early float64 // seconds
	if !valid {
		if err := u.conn.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(extract(epoch FROM max(shardgate_key_floor(key) - created_at)), 0)::float8
			FROM %s WHERE created_at < shardgate_key_floor(key)`, table)).Scan(&early); err != nil {
			return fmt.Errorf("read how early its records are dated: %w", err)
		}
		if early > maxEarlyBy.Seconds() {
			return fmt.Errorf("a record in it is dated %s before its key's time, more than the %s early_by may grow by (a clock was far off when it was written); it leaves with retention",
				time.Duration(early*float64(time.Second)).Round(time.Second), maxEarlyBy)
		}
	}
	// One statement: a lookup reads both columns of the one row in one snapshot.
	_, err := u.conn.Exec(ctx, `UPDATE shardgate_record_floor SET early_by = greatest(early_by, make_interval(secs => $2)), unchecked_before = $1
		WHERE unchecked_before > $1`, p.From, early)
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
