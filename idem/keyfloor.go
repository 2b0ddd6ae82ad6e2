package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// redateBatch is how many records one short transaction dates at their keys' floors.
const redateBatch = 1000

// ruleHeldMarker is the comment upkeep puts on a partition it cannot bring under the key-floor
// rule because a record's floor lies in no partition, so that later passes do not read it again
// for nothing. The partition stays in every lookup until retention drops it. It is quoted into
// COMMENT ON as it is: no quote in it.
const ruleHeldMarker = "shardgate upkeep: holds a record whose key floor lies in no partition; kept in every key lookup"

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
// once retention has dropped every partition it had then. A partition already under the rule
// (created since 0006, or validated) only moves the bound. One whose copy of the rule is NOT
// VALID (it held records before the rule existed, or was attached again without the rule):
//
//  1. its records dated before their key's floor (written before 0006, by a client whose clock
//     ran ahead of the shard's) are found by reading it, and dated at their floor, as 0006's
//     writers date new ones: later, so kept that much longer, and moved to the partition that
//     holds the floor. They are dated in short transactions of redateBatch records, each under
//     the ownership lock taken shared, as a transfer takes it, and only if it is free at once:
//     a range move's settle (which takes it exclusively, then deletes records) never meets their
//     row locks, and a pass that finds one under way leaves the rest to the next;
//  2. ALTER TABLE ... VALIDATE CONSTRAINT has PostgreSQL check the rule over the partition, and
//     unchecked_before becomes its lower bound, in one transaction: a lookup that reads the
//     lowered bound reads every record as dated under the rule.
//
// Transfers go on meanwhile: the locks are ROW EXCLUSIVE on idempotency_record, SHARE UPDATE
// EXCLUSIVE on the one partition, and the re-dated records' rows for a moment. It stops at a
// partition detached half-way or without finite bounds, and after ruleCatchUpBudget. Why it
// stopped early otherwise (a record whose floor lies in no partition, a range move, an error) is
// UpkeepReport.RuleHeld, not a failure of the pass: until the rule covers them, lookups read these
// partitions as they did before 0006.
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
		if err := u.underRule(ctx, p, parts); errors.Is(err, errMarkedHeld) {
			return nil // said when it was marked; shardgate_idempotency_unchecked_partitions counts it
		} else if err != nil {
			return fmt.Errorf("partition %s is not yet under the key-floor rule (%s), so every key lookup still reads it and those before it: %w", p.Name, keyFloorRule, err)
		}
		unchecked = p.From
		u.rep.Checked = append(u.rep.Checked, p.Name)
	}
	return nil
}

// underRule brings partition p under the rule and takes it out of unchecked_before; parts are
// the partitions of idempotency_record.
func (u *upkeeper) underRule(ctx context.Context, p catalogPartition, parts []catalogPartition) error {
	table := pgx.Identifier{p.schema, p.Name}.Sanitize()
	var (
		valid   bool
		comment *string
	)
	if err := u.conn.QueryRow(ctx, `SELECT c.convalidated, obj_description(c.conrelid, 'pg_class') FROM pg_constraint c
		WHERE c.conrelid = $1::regclass AND c.conname = $2`, table, keyFloorRule).Scan(&valid, &comment); err != nil {
		return fmt.Errorf("read its copy of the rule: %w", err)
	}
	if !valid {
		if comment != nil && *comment == ruleHeldMarker {
			return errMarkedHeld
		}
		if err := u.redate(ctx, p, parts); err != nil {
			return err
		}
	}
	return pgx.BeginFunc(ctx, u.conn, func(tx pgx.Tx) error {
		if !valid {
			if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s VALIDATE CONSTRAINT %s", table, pgx.Identifier{keyFloorRule}.Sanitize())); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, "UPDATE shardgate_record_floor SET unchecked_before = $1 WHERE unchecked_before > $1", p.From)
		return err
	})
}

// redate dates p's records that predate their key's floor at the floor (step 1 of
// bringUnderRule).
func (u *upkeeper) redate(ctx context.Context, p catalogPartition, parts []catalogPartition) error {
	table := pgx.Identifier{p.schema, p.Name}.Sanitize()
	rows, err := u.conn.Query(ctx, fmt.Sprintf("SELECT scope, key, shardgate_key_floor(key) FROM %s WHERE created_at < shardgate_key_floor(key)", table))
	if err != nil {
		return fmt.Errorf("find its records dated before their key's floor: %w", err)
	}
	var (
		scopes, keys []string
		scope, key   string
		floor        time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&scope, &key, &floor}, func() error {
		if !slices.ContainsFunc(parts, func(q catalogPartition) bool {
			return q.bounded && !q.pending && !floor.Before(q.From) && floor.Before(q.To)
		}) {
			return errNoFloorPartition{floor}
		}
		scopes, keys = append(scopes, scope), append(keys, key)
		return nil
	})
	if nf, ok := errors.AsType[errNoFloorPartition](err); ok {
		if _, cerr := u.conn.Exec(ctx, fmt.Sprintf("COMMENT ON TABLE %s IS '%s'", table, ruleHeldMarker)); cerr != nil {
			return errors.Join(err, cerr)
		}
		return fmt.Errorf("%w; upkeep marked the table so as not to read it again for nothing, and it leaves with retention", nf)
	}
	if err != nil {
		return fmt.Errorf("find its records dated before their key's floor: %w", err)
	}
	for len(keys) > 0 {
		n := min(len(keys), redateBatch)
		err := pgx.BeginFunc(ctx, u.conn, func(tx pgx.Tx) error {
			var free bool
			if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock_shared($1, $2)", LockClass, LockOwnership).Scan(&free); err != nil {
				return err
			}
			if !free {
				return errors.New("a range move holds (or waits for) the shard's ownership lock; the next pass goes on")
			}
			_, err := tx.Exec(ctx, `UPDATE idempotency_record r SET created_at = shardgate_key_floor(r.key)
				FROM unnest($1::text[], $2::text[]) AS m(scope, key)
				WHERE r.scope = m.scope AND r.key = m.key AND r.created_at >= $3 AND r.created_at < $4
				  AND r.created_at < shardgate_key_floor(r.key)`, scopes[:n], keys[:n], p.From, p.To)
			return err
		})
		if err != nil {
			return fmt.Errorf("date its records at their keys' floors: %w", err)
		}
		scopes, keys = scopes[n:], keys[n:]
	}
	return nil
}

// errMarkedHeld: the partition bears ruleHeldMarker.
var errMarkedHeld = errors.New("marked as holding a record whose key's floor lies in no partition")

// errNoFloorPartition: a record's key's floor lies in no attached partition, so the record
// cannot be dated at it.
type errNoFloorPartition struct{ floor time.Time }

func (e errNoFloorPartition) Error() string {
	return fmt.Sprintf("a record in it is dated before its key's floor, %s, which lies in no partition", e.floor.UTC().Format(time.RFC3339Nano))
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
