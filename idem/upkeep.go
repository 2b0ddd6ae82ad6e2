package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/partition"
)

// UpkeepOptions configures one pass of Upkeep.
type UpkeepOptions struct {
	Interval partition.Interval // partition.Daily or partition.Monthly
	Ahead    int                // partitions kept ready beyond the one holding Now
	// Retention is how long keys are kept: a partition is dropped only once its whole range
	// ends at or before Now - Retention. It must be positive.
	Retention time.Duration
	// Now is the time upkeep works from. Zero means the shard's own clock, the clock that stamps
	// created_at.
	Now time.Time
	// LockTimeout bounds every lock wait of the pass, including DETACH ... CONCURRENTLY's wait
	// for transactions still using idempotency_record. Zero means one minute. A pass that times
	// out fails; whatever it left half done, the next pass finishes.
	LockTimeout time.Duration
}

// defaultLockTimeout is UpkeepOptions.LockTimeout when zero.
const defaultLockTimeout = time.Minute

// UpkeepReport is what one pass of Upkeep did on one shard.
type UpkeepReport struct {
	// Skipped means another upkeep (another router, usually) held the shard's upkeep lock, so
	// this pass did nothing. It is neither a failure nor a success.
	Skipped    bool
	Now        time.Time // the time the pass worked from
	Created    []string  // partitions created
	Reattached []string  // tables bearing a needed partition's name, attached again
	Dropped    []string  // partitions detached and dropped: their whole range was older than retention
	// Checked are the partitions taken out of the lookups of keys of any time, newest first: each
	// is now wholly under the key-floor rule of migration 0006 (bringUnderRule).
	Checked []string
	// RuleHeld, when set, says why the pass stopped bringing partitions under the key-floor rule
	// before it had them all (an error). It is no failure of the pass: lookups still read those
	// partitions, as before 0006, and the next pass tries again.
	RuleHeld string
	// State is what the shard holds after a successful pass; zero otherwise.
	State PartitionState
}

// PartitionState is a shard's idempotency_record partitions as read at ReadAt.
type PartitionState struct {
	ReadAt     time.Time
	Partitions []partition.Partition // attached, oldest first; partitions whose bounds are not one finite range are left out
	Rows       int64                 // estimated, from pg_class.reltuples of the partitions
	Bytes      int64                 // pg_total_relation_size summed over the partitions
	// UncheckedBefore is shardgate_record_floor.unchecked_before: every lookup reads the
	// partitions that begin before it, whatever its key's time. Zero before migration 0006, when
	// every lookup reads every partition.
	UncheckedBefore time.Time
}

// dropMarker is the comment Upkeep puts on an expired partition before it detaches it. A table
// outside idempotency_record that bears it and our naming scheme is one whose DROP was
// interrupted, and the next pass drops it; a table without it is never dropped.
const dropMarker = "shardgate upkeep: expired idempotency partition, detached to be dropped"

// Upkeep runs one pass of partition upkeep on the shard behind pool:
//
//  1. It attaches the partition holding Now and the Ahead partitions after it, creating them
//     with EnsurePartitions (SHARE UPDATE EXCLUSIVE on idempotency_record: transfers go on).
//  2. It detaches every partition whose whole range is older than Retention with ALTER TABLE
//     ... DETACH PARTITION ... CONCURRENTLY, then drops it. Only range partitions of
//     idempotency_record whose name and bounds follow our scheme (idempotency_record_YYYY_MM_DD
//     holding that day, or _YYYY_MM holding that month) are ever dropped; other partitions and
//     other tables are left alone. Nothing younger than Retention is ever dropped.
//  3. It finishes what an interrupted pass left behind: a partition left "detach pending" by an
//     interrupted DETACH CONCURRENTLY is finalized (DETACH PARTITION ... FINALIZE) and dropped
//     if expired, or finalized first and attached again in step 1 if it holds Now or a later
//     time; a detached table whose DROP was interrupted is dropped. Any other pending detach
//     is an error, left for an operator: its keys are no longer checked.
//  4. It drops the change-capture triggers when no range move is listed (DropIdleCapture).
//  5. On a shard upgraded to migration 0006, it brings the partitions from before the key-floor
//     rule under it, newest first, for up to ruleCatchUpBudget (bringUnderRule), so that
//     lookups stop reading them whatever their key's time.
//
// A missing partition for the current time is never papered over: there is no DEFAULT
// partition (one would silently hold rows and later block ATTACH), so until upkeep creates the
// partition, the transfer functions fail with SQLSTATE 23514, Transfer returns ErrNoPartition, and
// nothing is stored, the debit included. Upkeep refuses to run while idempotency_record has a
// DEFAULT partition.
//
// Locking: the pass runs on one connection of its own, which holds the session advisory lock
// LockUpkeep for the whole pass and is closed at the end (closing releases the lock whatever
// happened). A second upkeep on the same shard takes the lock with pg_try_advisory_lock, so it
// skips (Skipped) rather than waits, and never becomes part of a lock cycle. Step 1 takes the
// same lock again as a transaction lock on the same session, which is granted at once (advisory
// locks are re-entrant per session); on any other connection it would wait for ourselves. DETACH
// CONCURRENTLY cannot run in a transaction block, so it runs outside one; it waits for every
// transaction already using idempotency_record, so the pass must not hold, or wait for, anything
// such a transaction could wait on. Besides SHARE UPDATE EXCLUSIVE (which ATTACH and DETACH
// CONCURRENTLY take, and which no transfer conflicts with) it holds only the advisory lock,
// which transfers never take, and EnsurePartitions callers elsewhere wait for that lock before
// they touch idempotency_record. Every lock wait of the pass is bounded by LockTimeout, so a
// long transaction makes the pass fail (and alert) instead of hang.
func Upkeep(ctx context.Context, pool *pgxpool.Pool, o UpkeepOptions) (UpkeepReport, error) {
	var rep UpkeepReport
	if err := o.validate(); err != nil {
		return rep, err
	}
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return rep, err
	}
	// The connection leaves the pool and is closed at the end, so its session lock and settings
	// never outlive the pass, even if unlocking fails.
	conn := pc.Hijack()
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		conn.Close(cctx) //nolint:errcheck // the server ends the session either way
	}()

	var locked bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", LockClass, LockUpkeep).Scan(&locked); err != nil {
		return rep, fmt.Errorf("take upkeep lock: %w", err)
	}
	if !locked {
		rep.Skipped = true
		return rep, nil
	}
	// Unlock before closing: the server releases a closed session's locks only once its backend
	// has exited, so an upkeep starting right after this one could skip for nothing.
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		conn.Exec(uctx, "SELECT pg_advisory_unlock($1, $2)", LockClass, LockUpkeep) //nolint:errcheck // closing the connection releases it too
	}()
	lockTimeout := o.LockTimeout
	if lockTimeout == 0 {
		lockTimeout = defaultLockTimeout
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("SET lock_timeout = %d", max(lockTimeout.Milliseconds(), 1))); err != nil {
		return rep, err
	}
	rep.Now = o.Now
	if rep.Now.IsZero() {
		if err := conn.QueryRow(ctx, "SELECT statement_timestamp()").Scan(&rep.Now); err != nil {
			return rep, err
		}
	}
	u := upkeeper{conn: conn, o: o, now: rep.Now, cutoff: rep.Now.Add(-o.Retention), rep: &rep}
	if err := u.run(ctx); err != nil {
		return rep, err
	}
	rep.State, err = readPartitionState(ctx, conn)
	return rep, err
}

func (o UpkeepOptions) validate() error {
	switch {
	case o.Interval != partition.Daily && o.Interval != partition.Monthly:
		return fmt.Errorf("upkeep: %v is not a partition interval (partition.Daily or partition.Monthly)", o.Interval)
	case o.Ahead < 0:
		return fmt.Errorf("upkeep: Ahead is %d; it counts future partitions and cannot be negative", o.Ahead)
	case o.Retention <= 0:
		return fmt.Errorf("upkeep: Retention is %s; it must be positive, or every past partition would be dropped", o.Retention)
	case o.LockTimeout < 0:
		return fmt.Errorf("upkeep: LockTimeout is %s; use a positive duration, or zero for the default", o.LockTimeout)
	}
	return nil
}

// upkeeper is one pass of Upkeep on the connection holding the upkeep lock.
type upkeeper struct {
	conn   *pgx.Conn
	o      UpkeepOptions
	now    time.Time
	cutoff time.Time // a partition ending at or before this is expired
	rep    *UpkeepReport
}

func (u *upkeeper) run(ctx context.Context) error {
	parts, err := listPartitions(ctx, u.conn)
	if err != nil {
		return err
	}
	for _, p := range parts {
		if p.isDefault {
			return fmt.Errorf("idempotency_record has a DEFAULT partition, %s: shardgate runs without one, because it would silently hold rows whose partition is missing and block attaching that partition later; move its rows into the proper partitions and drop it, then run upkeep again", p.Name)
		}
	}

	// A pending detach of the current or a future partition means transfers have no partition
	// for those times: finish the detach so that EnsurePartitions can attach the table again.
	var (
		pending     *catalogPartition
		finalizeErr error
	)
	for i, p := range parts {
		if !p.pending {
			continue
		}
		if p.ours && p.To.After(u.now) {
			if err := u.exec(ctx, "ALTER TABLE idempotency_record DETACH PARTITION %s FINALIZE", p); err != nil {
				finalizeErr = fmt.Errorf("finish the interrupted detach of %s to attach it again: %w", p.Name, err)
			}
			continue
		}
		pending = &parts[i]
	}

	// Creating comes before dropping: a shard without tomorrow's partition is an outage, an
	// expired partition kept an hour longer is not. A partition whose detach could not be
	// finished above is still listed as attached, so it is neither created nor attached here.
	created, reattached, err := ensurePartitions(ctx, u.conn, u.o.Interval, u.now, u.o.Ahead)
	if err != nil {
		return errors.Join(finalizeErr, err)
	}
	u.rep.Created, u.rep.Reattached = created, reattached
	if finalizeErr != nil {
		return finalizeErr
	}

	// PostgreSQL allows one pending detach per table, so it is finished before any other.
	if pending != nil {
		if !pending.ours || pending.To.After(u.cutoff) {
			return fmt.Errorf("partition %s of idempotency_record is pending detach (an interrupted DETACH ... CONCURRENTLY that upkeep did not start) and is not an expired partition of ours, so its keys are no longer checked; upkeep will not drop it. Attach it again (ALTER TABLE idempotency_record DETACH PARTITION %s FINALIZE, then ATTACH PARTITION with its bounds) or finish the detach by hand", pending.Name, pending.Name)
		}
		if err := u.drop(ctx, *pending); err != nil {
			return err
		}
	}
	for _, p := range parts {
		if p.pending || !p.ours || p.To.After(u.cutoff) {
			continue
		}
		if err := u.drop(ctx, p); err != nil {
			return err
		}
	}
	if err := u.dropLeftovers(ctx); err != nil {
		return err
	}
	// A move's change capture outlives it when the apply that settled the move could not drop it
	// (transfers held the tables), or on a shard upgraded from a release that kept it always.
	if _, err := DropIdleCapture(ctx, u.conn); err != nil {
		return fmt.Errorf("drop the change capture that no move needs: %w", err)
	}
	u.bringUnderRule(ctx)
	return nil
}

// drop marks expired partition p, detaches it (or, when pending, finishes its detach) and drops
// it. The mark lets a later pass recognize the table if the DROP is interrupted.
func (u *upkeeper) drop(ctx context.Context, p catalogPartition) error {
	if err := u.exec(ctx, "COMMENT ON TABLE %s IS '"+dropMarker+"'", p); err != nil {
		return fmt.Errorf("mark expired partition %s: %w", p.Name, err)
	}
	detach := "ALTER TABLE idempotency_record DETACH PARTITION %s CONCURRENTLY"
	if p.pending {
		detach = "ALTER TABLE idempotency_record DETACH PARTITION %s FINALIZE"
	}
	if err := u.exec(ctx, detach, p); err != nil {
		return fmt.Errorf("detach expired partition %s: %w", p.Name, err)
	}
	if err := u.exec(ctx, "DROP TABLE %s", p); err != nil {
		return fmt.Errorf("drop detached partition %s: %w", p.Name, err)
	}
	u.rep.Dropped = append(u.rep.Dropped, p.Name)
	return nil
}

// dropLeftovers drops tables that an earlier pass detached but did not get to drop: they bear
// dropMarker, are no partition, and their name says their range is expired.
func (u *upkeeper) dropLeftovers(ctx context.Context) error {
	rows, err := u.conn.Query(ctx, `SELECT n.nspname, c.relname FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_description d ON d.objoid = c.oid AND d.classoid = 'pg_class'::regclass AND d.objsubid = 0
		WHERE c.relkind = 'r' AND NOT c.relispartition AND d.description = $1
		  AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'idempotency_record'::regclass)
		ORDER BY c.relname`, dropMarker)
	if err != nil {
		return err
	}
	var (
		left []catalogPartition
		t    catalogPartition
	)
	if _, err := pgx.ForEachRow(rows, []any{&t.schema, &t.Name}, func() error {
		left = append(left, t)
		return nil
	}); err != nil {
		return err
	}
	for _, t := range left {
		if p, ok := partition.ParseName(t.Name); !ok || p.To.After(u.cutoff) {
			continue
		}
		if err := u.exec(ctx, "DROP TABLE %s", t); err != nil {
			return fmt.Errorf("drop %s, detached by an earlier upkeep: %w", t.Name, err)
		}
		u.rep.Dropped = append(u.rep.Dropped, t.Name)
	}
	return nil
}

// exec runs one statement about table t, named schema-qualified, on its own, outside any
// transaction block.
func (u *upkeeper) exec(ctx context.Context, format string, t catalogPartition) error {
	_, err := u.conn.Exec(ctx, fmt.Sprintf(format, pgx.Identifier{t.schema, t.Name}.Sanitize()))
	return err
}

// catalogPartition is one partition of idempotency_record as the catalog describes it. From
// and To are set only when its bounds are one finite range.
type catalogPartition struct {
	partition.Partition
	schema    string
	bounded   bool
	isDefault bool
	pending   bool // detach pending: an interrupted DETACH ... CONCURRENTLY
	// ours: bounded, in idempotency_record's schema, and name and bounds follow our scheme.
	ours bool
}

// listPartitions reads every partition of idempotency_record, oldest first. The bounds are
// read back through timestamptz in the same statement, so that neither the session's TimeZone
// nor its DateStyle matters.
func listPartitions(ctx context.Context, conn *pgx.Conn) ([]catalogPartition, error) {
	rows, err := conn.Query(ctx, `SELECT schema, name, same_schema, pending, bound = 'DEFAULT', m[1]::timestamptz, m[2]::timestamptz
		FROM (SELECT n.nspname AS schema, c.relname AS name, i.inhdetachpending AS pending,
		             c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'idempotency_record'::regclass) AS same_schema,
		             pg_get_expr(c.relpartbound, c.oid) AS bound,
		             regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \(''([^'']*)''\) TO \(''([^'']*)''\)$') AS m
		        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		       WHERE i.inhparent = 'idempotency_record'::regclass) p
		ORDER BY 6 NULLS FIRST, 2`)
	if err != nil {
		return nil, err
	}
	var (
		out        []catalogPartition
		p          catalogPartition
		sameSchema bool
		from, to   pgtype.Timestamptz
	)
	_, err = pgx.ForEachRow(rows, []any{&p.schema, &p.Name, &sameSchema, &p.pending, &p.isDefault, &from, &to}, func() error {
		q := p
		if from.Valid && to.Valid && from.InfinityModifier == pgtype.Finite && to.InfinityModifier == pgtype.Finite {
			q.bounded, q.From, q.To = true, from.Time.UTC(), to.Time.UTC()
			q.ours = sameSchema && partition.FollowsScheme(q.Partition)
		}
		out = append(out, q)
		return nil
	})
	return out, err
}

// readPartitionState reads the attached partitions with their estimated rows and total size.
func readPartitionState(ctx context.Context, conn *pgx.Conn) (PartitionState, error) {
	st := PartitionState{ReadAt: time.Now()}
	parts, err := listPartitions(ctx, conn)
	if err != nil {
		return st, err
	}
	for _, p := range parts {
		if p.bounded && !p.pending {
			st.Partitions = append(st.Partitions, p.Partition)
		}
	}
	// reltuples is -1 for a partition never vacuumed or analyzed; pg_total_relation_size is NULL
	// for a partition dropped since the catalog was read.
	err = conn.QueryRow(ctx, `SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint,
		       coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
		  FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		 WHERE i.inhparent = 'idempotency_record'::regclass AND NOT i.inhdetachpending`).Scan(&st.Rows, &st.Bytes)
	if err != nil {
		return st, fmt.Errorf("read idempotency_record size: %w", err)
	}
	st.UncheckedBefore, _, err = readUncheckedBefore(ctx, conn)
	return st, err
}
