package rangemove

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/shardmap"
)

// The phases of a move, as shardgate_range_move.phase and Progress.Phase say them.
const (
	PhaseCopying    = "copying"     // the bulk copy, while the old owner serves the range
	PhaseCatchingUp = "catching_up" // passes over the changes written since, still serving
	PhaseFenced     = "fenced"      // revoked everywhere: the last changes, then the grant
	PhaseGranted    = "granted"     // the new owner serves the range
	PhasePurging    = "purging"     // the old owner deletes the moved rows, in the background
)

// Options tune Apply. The zero value is ApplyMap's.
type Options struct {
	Interval partition.Interval // of the idempotency record partitions (partition.Daily if zero)
	// Progress, unless nil, is called on long work: every bulk-copy batch, every catch-up pass,
	// the fence and the purge.
	Progress func(Progress)
	// OnFenced, unless nil, runs right after every shard has revoked what it loses: the moment
	// to hand routers the new map (`apply --map`), so they find the new owners at the grant.
	// An error stops the apply there; running it again goes on.
	OnFenced func() error
	// CatchUpBelow ends the catch-up while the old owner serves: once a pass leaves fewer
	// changes than this, the range is fenced for the last ones. 200 if zero.
	CatchUpBelow int64
	// Pace slows the background work down so that the shards keep CPU for transfers: after each
	// bulk-copy batch, catch-up pass or purge transaction that took d, the apply pauses Pace×d
	// (idem.Nap), so each takes at least (1+Pace) times as long. Nothing behind the fence (the last
	// catch-up and the grant) pauses. 0 does not pause (ApplyMap's); from 0 to idem.MaxPace;
	// router.yaml's range_moves.pace is DefaultPace unless set.
	Pace float64
}

// DefaultPace is the pace of `router shardmap apply` and of the purge `router serve` runs,
// unless router.yaml's range_moves.pace or apply --pace says otherwise. On a 2-core machine it
// left the machine about half idle during the copy of 1,000,000 transfers and kept apply within
// 4 min 19 s – 4 min 37 s under load. It bounds the move's share of the CPU, not what the other
// ranges' p99 pays beside each batch, which was alike at 0, 1 and 2 (docs/operations.md); a
// higher pace cost minutes for little more.
const DefaultPace = 1.0

// Progress is where one move stands.
type Progress struct {
	Phase    string
	From, To string
	Range    shardmap.KeyRange
	// Copied of Total rows (records, ledger rows and owed credits) the bulk copy has copied;
	// Rate is this run's, in rows per second, and ETA the bulk copy's time left at that rate.
	Copied, Total int64
	Rate          float64
	ETA           time.Duration
	// Lag is how many changes written in the range since the copy began are not yet on To.
	Lag int64
	// Fenced is how long the range has been owned by no shard (PhaseFenced, PhaseGranted).
	Fenced time.Duration
	// Purged counts the rows deleted from From so far (PhasePurging).
	Purged int64
}

func (o Options) withDefaults() Options {
	if o.Interval == 0 {
		o.Interval = partition.Daily
	}
	if o.CatchUpBelow <= 0 {
		o.CatchUpBelow = 200
	}
	return o
}

func (o Options) report(p Progress) {
	if o.Progress != nil {
		o.Progress(p)
	}
}

// testHook, when set by a test, is called at the points named: "copy" after each bulk-copy
// batch, "catch-up" after each catch-up pass, "fenced" after the revoke.
var testHook func(point string)

func hook(point string) {
	if testHook != nil {
		testHook(point)
	}
}

// fenceTimeout bounds the last catch-up: the changes of transactions that were running at the
// revoke must have ended by then.
const fenceTimeout = 30 * time.Second

// startMove lists mv's range on its source as moving to mv.To, unless it is already (a
// stopped apply resumes from its cursor), and waits until every transaction that was running
// then has ended: from then on every row written or changed in the range is in
// shardgate_range_change, and the bulk copy sees every row written before. Listing the move
// creates the change-capture triggers in the same transaction (sql/shardgate_capture_start.sql),
// so they exist before the wait begins; its locks wait for transfers, briefly
// (idem.WithBriefLocks). A listed move keeps its triggers: they are dropped only once the shard
// lists none (idem.DropIdleCapture).
func startMove(ctx context.Context, src *pgxpool.Pool, mv MoveReport, version int64) error {
	lo, hi := idem.Bounds(mv.Range)
	err := idem.WithBriefLocks(ctx, src, func(tx pgx.Tx) error {
		var dst *string
		if err := tx.QueryRow(ctx, "SELECT dst FROM shardgate_range_move WHERE key_range = $1 FOR UPDATE", mv.Range.String()).Scan(&dst); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if dst != nil && *dst == mv.To {
			return nil
		}
		if dst != nil {
			// Begun towards another shard by an apply of another map: start over.
			if _, err := tx.Exec(ctx, "DELETE FROM shardgate_range_move WHERE key_range = $1", mv.Range.String()); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO shardgate_range_move (lo, hi, key_range, dst, map_version, rows_total)
			SELECT $1, $2, $3, $4, $5, (SELECT count(*) FROM idempotency_record WHERE `+inRange+`)
				+ (SELECT count(*) FROM ledger_entries WHERE `+inRange+`) + (SELECT count(*) FROM shardgate_credit_outbox WHERE `+inRange+`)`,
			lo, hi, mv.Range.String(), mv.To, version)
		return err
	})
	if err != nil {
		return fmt.Errorf("start the move: %w", err)
	}
	var xmax string
	if err := src.QueryRow(ctx, "SELECT pg_snapshot_xmax(pg_current_snapshot())::text").Scan(&xmax); err != nil {
		return err
	}
	for {
		var ended bool
		if err := src.QueryRow(ctx, "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::text::xid8", xmax).Scan(&ended); err != nil {
			return err
		}
		if ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// dropStaleMoves forgets, on every shard of m, the moves an earlier apply began that none of
// moves continues, with their captured changes: their copies on the shard they went to are
// listed there as copied, and the settle of this apply lists them to purge. A shard left with no
// move drops its change-capture triggers (idem.DropIdleCapture).
func dropStaleMoves(ctx context.Context, m *shardmap.Map, pool func(string) *pgxpool.Pool, moves []MoveReport) error {
	for _, s := range m.Shards {
		var keep []string
		for _, mv := range moves {
			if mv.From == s.Name {
				keep = append(keep, mv.Range.String()+"\n"+mv.To)
			}
		}
		err := pgx.BeginFunc(ctx, pool(s.Name), func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, "DELETE FROM shardgate_range_move WHERE NOT (key_range || E'\\n' || dst = ANY ($1::text[]))", keep)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			_, err = tx.Exec(ctx, `DELETE FROM shardgate_range_change c WHERE NOT EXISTS (SELECT 1 FROM shardgate_range_move m
				WHERE c.keyspace_id >= m.lo AND (m.hi IS NULL OR c.keyspace_id < m.hi))`)
			return err
		})
		if err != nil {
			return fmt.Errorf("shard %s: forget moves of an earlier apply: %w", s.Name, err)
		}
		if _, err := idem.DropIdleCapture(ctx, pool(s.Name)); err != nil {
			return fmt.Errorf("shard %s: drop the change capture of forgotten moves: %w", s.Name, err)
		}
	}
	return nil
}

// dstServes reports whether dst is active on part of r: the move was granted by an earlier run,
// and dst's rows there are its own.
func dstServes(ctx context.Context, dst *pgxpool.Pool, r shardmap.KeyRange) (bool, error) {
	lo, hi := idem.Bounds(r)
	var ok bool
	err := dst.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM shardgate_owned_range
		WHERE active AND ($2::bigint IS NULL OR lo < $2) AND (hi IS NULL OR hi > $1))`, lo, hi).Scan(&ok)
	return ok, err
}

// copyOnline copies mv's range from src to dst while src keeps serving it: the bulk copy in
// keyset batches from the cursor stored on src, then catch-up passes until fewer than
// opts.CatchUpBelow changes are left.
func copyOnline(ctx context.Context, src, dst *pgxpool.Pool, mv *MoveReport, version int64, opts Options) error {
	if served, err := dstServes(ctx, dst, mv.Range); err != nil || served {
		return err
	}
	if err := startMove(ctx, src, *mv, version); err != nil {
		return err
	}
	if err := ensureCopyPartitions(ctx, src, dst, mv.Range, opts.Interval); err != nil {
		return err
	}
	key := mv.Range.String()
	var (
		stage         string
		ks            *int64
		a, b          *string
		total, copied int64
	)
	if err := src.QueryRow(ctx, "SELECT stage, after_ks, after_a, after_b, rows_total, rows_copied FROM shardgate_range_move WHERE key_range = $1", key).
		Scan(&stage, &ks, &a, &b, &total, &copied); err != nil {
		return err
	}
	p := Progress{Phase: PhaseCopying, From: mv.From, To: mv.To, Range: mv.Range, Copied: copied, Total: max(total, copied)}
	began, copiedBefore := time.Now(), copied
	for i := slices.IndexFunc(tables, func(t tableCopy) bool { return t.stage == stage }); i >= 0 && i < len(tables); i++ {
		t := &tables[i]
		var c *cursor
		if ks != nil {
			c = &cursor{KS: *ks, A: deref(a), B: deref(b)}
		}
		done, err := t.copyAll(ctx, src, dst, mv.Range, c, mv, opts.Pace, func(n int, last cursor) error {
			var lb *string
			if len(t.keys) > 1 {
				lb = &last.B
			}
			if _, err := src.Exec(ctx, `UPDATE shardgate_range_move SET after_ks = $2, after_a = $3, after_b = $4,
				rows_copied = rows_copied + $5, updated_at = now() WHERE key_range = $1`, key, last.KS, last.A, lb, n); err != nil {
				return err
			}
			p.Copied += int64(n)
			p.Total = max(p.Total, p.Copied)
			if s := time.Since(began).Seconds(); s > 0 {
				p.Rate = float64(p.Copied-copiedBefore) / s
				p.ETA = time.Duration(float64(p.Total-p.Copied) / p.Rate * float64(time.Second))
			}
			opts.report(p)
			hook("copy")
			return ctx.Err()
		})
		if err != nil || done {
			return err
		}
		next := "done"
		if i+1 < len(tables) {
			next = tables[i+1].stage
		}
		if _, err := src.Exec(ctx, `UPDATE shardgate_range_move SET stage = $2, after_ks = NULL, after_a = NULL, after_b = NULL,
			updated_at = now() WHERE key_range = $1`, key, next); err != nil {
			return err
		}
		ks, a, b = nil, nil, nil
	}
	if _, err := src.Exec(ctx, "UPDATE shardgate_range_move SET phase = $2, updated_at = now() WHERE key_range = $1 AND phase = 'copying'", key, PhaseCatchingUp); err != nil {
		return err
	}
	p.Phase, p.ETA = PhaseCatchingUp, 0
	return catchUp(ctx, src, dst, mv, p, opts)
}

// catchUp runs catch-up passes over mv's range, reporting each in p, until fewer than
// opts.CatchUpBelow changes are left, or until catchUpStalls passes in a row leave no fewer than
// the best so far. Between two passes it pauses at opts.Pace (idem.Nap); the range is not fenced
// yet, so a pause holds no transfer up.
func catchUp(ctx context.Context, src, dst *pgxpool.Pool, mv *MoveReport, p Progress, opts Options) error {
	best, stalled := int64(-1), 0
	for {
		began := time.Now()
		_, lag, err := catchUpPass(ctx, src, dst, mv)
		if err != nil {
			return fmt.Errorf("catch up: %w", err)
		}
		p.Lag = lag
		opts.report(p)
		hook("catch-up")
		if err := ctx.Err(); err != nil {
			return err
		}
		if lag < opts.CatchUpBelow {
			return nil
		}
		// Writes in the range outpace the catch-up: fence anyway, rather than chase them forever.
		// The fence then lasts as long as the last lag takes to copy.
		if best < 0 || lag < best {
			best, stalled = lag, 0
		} else if stalled++; stalled >= catchUpStalls {
			return nil
		}
		if err := idem.Nap(ctx, opts.Pace, began); err != nil {
			return err
		}
	}
}

// catchUpStalls is how many catch-up passes in a row may leave no fewer changes than the best
// before the range is fenced all the same.
const catchUpStalls = 5

// catchUpBatch is how many captured changes one catch-up pass applies at most.
const catchUpBatch = 5000

// catchUpPass brings dst up to date with the changes captured in mv's range on src that were
// written by transactions older than every transaction running when the pass began (so none of
// them can still commit), at most catchUpBatch of them: it copies the changed rows as they are
// now, then forgets those changes on src. It returns how many changes it applied and how many
// are left.
func catchUpPass(ctx context.Context, src, dst *pgxpool.Pool, mv *MoveReport) (applied int, left int64, err error) {
	lo, hi := idem.Bounds(mv.Range)
	rows, err := src.Query(ctx, `SELECT id, tbl, ref_a, coalesce(ref_b, '') FROM shardgate_range_change
		WHERE `+inRange+` AND xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY id LIMIT $3`, lo, hi, catchUpBatch)
	if err != nil {
		return 0, 0, onSource(ctx, mv, err)
	}
	var (
		ids      []int64
		id       int64
		tbl      string
		ref      [2]string
		refs     = map[string][][2]string{}
		seen     = map[string]map[[2]string]bool{}
		scanArgs = []any{&id, &tbl, &ref[0], &ref[1]}
	)
	if _, err := pgx.ForEachRow(rows, scanArgs, func() error {
		ids = append(ids, id)
		if seen[tbl] == nil {
			seen[tbl] = map[[2]string]bool{}
		}
		if !seen[tbl][ref] {
			seen[tbl][ref] = true
			refs[tbl] = append(refs[tbl], ref)
		}
		return nil
	}); err != nil {
		return 0, 0, onSource(ctx, mv, err)
	}
	for _, t := range tables {
		named := refs[map[string]string{"records": "record", "ledger": "ledger", "outbox": "outbox"}[t.stage]]
		if len(named) == 0 {
			continue
		}
		as, bs := make([]string, len(named)), make([]string, len(named))
		for i, r := range named {
			as[i], bs[i] = r[0], r[1]
		}
		q := fmt.Sprintf("SELECT %s FROM %s t JOIN unnest($3::text[], $4::text[]) AS c(a, b) ON %s WHERE %s", prefixed("t.", t.cols), t.table, t.match, "t."+inRange)
		if _, err := copyInto(ctx, src, dst, mv, mv.Range, t.table, t.cols, q, []any{lo, hi, as, bs},
			func(ctx context.Context, tx pgx.Tx, _ int) error { return t.insert(ctx, tx, mv) }); err != nil {
			return 0, 0, err
		}
	}
	if len(ids) > 0 {
		if _, err := src.Exec(ctx, "DELETE FROM shardgate_range_change WHERE id = ANY ($1)", ids); err != nil {
			return 0, 0, onSource(ctx, mv, err)
		}
		if _, err := src.Exec(ctx, "UPDATE shardgate_range_move SET changes_done = changes_done + $2, updated_at = now() WHERE key_range = $1", mv.Range.String(), len(ids)); err != nil {
			return 0, 0, onSource(ctx, mv, err)
		}
	}
	err = src.QueryRow(ctx, "SELECT count(*) FROM shardgate_range_change WHERE "+inRange, lo, hi).Scan(&left)
	return len(ids), left, onSource(ctx, mv, err)
}

// onSource names mv's source shard in err, an error of reading or updating its captured
// changes; a stopped apply's error stays as it is.
func onSource(ctx context.Context, mv *MoveReport, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("shard %s: %w", mv.From, err)
}

// finishMove runs behind the fence, once every shard has revoked what it loses: no transfer
// can write in mv's range any more, so catch-up passes bring dst up to every change, waiting
// for the transactions that were running at the revoke to end.
func finishMove(ctx context.Context, src, dst *pgxpool.Pool, mv *MoveReport, opts Options, fenced time.Time) error {
	if served, err := dstServes(ctx, dst, mv.Range); err != nil || served {
		return err
	}
	deadline := time.Now().Add(fenceTimeout)
	for {
		applied, left, err := catchUpPass(ctx, src, dst, mv)
		if err != nil {
			return fmt.Errorf("last catch-up: %w", err)
		}
		opts.report(Progress{Phase: PhaseFenced, From: mv.From, To: mv.To, Range: mv.Range, Lag: left, Fenced: time.Since(fenced)})
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("last catch-up: %d changes of transactions still running on %s after %v; run apply again", left, mv.From, fenceTimeout)
		}
		if applied == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// prefixed qualifies each of the comma-separated columns cols with p.
func prefixed(p, cols string) string {
	parts := splitCols(cols)
	for i := range parts {
		parts[i] = p + parts[i]
	}
	return joinCols(parts)
}

func joinCols(parts []string) string { return strings.Join(parts, ", ") }

// FormatProgress says p in one line, as `router shardmap apply` prints it.
func FormatProgress(p Progress) string {
	head := fmt.Sprintf("%s → %s %s: %s", p.From, p.To, p.Range, p.Phase)
	switch p.Phase {
	case PhaseCopying:
		pct := 100.0
		if p.Total > 0 {
			pct = 100 * float64(p.Copied) / float64(p.Total)
		}
		return fmt.Sprintf("%s, %d of %d rows (%.0f%%), %.0f rows/s, ETA %v", head, p.Copied, p.Total, pct, p.Rate, p.ETA.Round(time.Second))
	case PhaseCatchingUp:
		return fmt.Sprintf("%s, %d changes behind", head, p.Lag)
	case PhaseFenced:
		return fmt.Sprintf("%s for %v, %d changes behind", head, p.Fenced.Round(time.Millisecond), p.Lag)
	case PhaseGranted:
		return fmt.Sprintf("%s after a fence of %v", head, p.Fenced.Round(time.Millisecond))
	case PhasePurging:
		return fmt.Sprintf("%s done, %d moved rows deleted from %s", head, p.Purged, p.From)
	}
	return head
}
