package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// briefLockTimeout bounds each wait for a table lock that transfers hold (lock_timeout): the
// transfers that arrive meanwhile queue behind the waiting lock, so the wait adds to their
// latency. A transfer holds its locks for milliseconds; a wait this long means a long
// transaction, which is waited out by trying again later rather than in the queue.
const briefLockTimeout = 100 * time.Millisecond

// briefLockTries is how many times WithBriefLocks runs its function before it gives up.
const briefLockTries = 5

// WithBriefLocks runs fn in a transaction on db whose every lock wait ends after
// briefLockTimeout, and runs it again, after a pause, when a wait timed out or ended in a
// deadlock: at most briefLockTries times, then it returns that error.
func WithBriefLocks(ctx context.Context, db txStarter, fn func(pgx.Tx) error) error {
	for try := 1; ; try++ {
		err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", briefLockTimeout.Milliseconds())); err != nil {
				return err
			}
			return fn(tx)
		})
		if !lockWaitEnded(err) || try == briefLockTries {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(try) * briefLockTimeout):
		}
	}
}

// lockWaitEnded reports whether err is a lock wait that timed out (lock_not_available) or was
// ended as a deadlock (deadlock_detected).
func lockWaitEnded(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "40P01")
}

// captureIdleSQL is true when the change-capture triggers exist and no move is listed.
const captureIdleSQL = `SELECT NOT EXISTS (SELECT 1 FROM shardgate_range_move)
	AND EXISTS (SELECT 1 FROM pg_trigger WHERE tgname LIKE 'shardgate_capture_change%' AND tgparentid = 0
	             AND tgrelid IN ('idempotency_record'::regclass, 'ledger_entries'::regclass, 'shardgate_credit_outbox'::regclass))`

// DropIdleCapture drops the change-capture triggers (sql/shardgate_capture_change.sql) on the
// shard behind db when it lists no range move, and reports whether it did. They are needed only
// while a range moves out (listing a move creates them, sql/shardgate_capture_start.sql), and
// every insert into the three tables pays for them.
//
// Dropping a trigger takes its table's ACCESS EXCLUSIVE lock, which waits for every transaction
// using the table, readers too. The locks are taken in the order a transfer first touches the
// tables (it reads idempotency_record, then writes ledger_entries, idempotency_record and
// shardgate_credit_outbox), so a transfer holding one never waits for another held here; each
// wait is bounded (WithBriefLocks). When transactions held the tables every time, the triggers
// stay, with no error: they cost time, not correctness, and the next call drops them.
func DropIdleCapture(ctx context.Context, db txStarter) (bool, error) {
	var idle bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error { return tx.QueryRow(ctx, captureIdleSQL).Scan(&idle) })
	if err != nil || !idle {
		return false, err
	}
	err = WithBriefLocks(ctx, db, func(tx pgx.Tx) error {
		idle = false
		if _, err := tx.Exec(ctx, "LOCK TABLE idempotency_record, ledger_entries, shardgate_credit_outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
			return err
		}
		// Read after the locks: a move listed meanwhile has committed, with its triggers.
		if err := tx.QueryRow(ctx, captureIdleSQL).Scan(&idle); err != nil || !idle {
			return err
		}
		_, err := tx.Exec(ctx, `DROP TRIGGER IF EXISTS shardgate_capture_change ON ledger_entries;
			DROP TRIGGER IF EXISTS shardgate_capture_change ON idempotency_record;
			DROP TRIGGER IF EXISTS shardgate_capture_change ON shardgate_credit_outbox;
			DROP TRIGGER IF EXISTS shardgate_capture_change_update ON shardgate_credit_outbox`)
		return err
	})
	if lockWaitEnded(err) {
		return false, nil
	}
	return idle && err == nil, err
}
