// Package rangemove moves key ranges between shards: it makes the shards of a shard map own
// exactly its ranges (`router shardmap apply`, and the last step of `router migrate`), copying
// the idempotency records and ledger rows of every range that changes owner so that a retry on
// the new owner replays instead of applying again. It coordinates the cluster from outside:
// what runs on one shard (ownership rows, their phases, the key locks) is package idem's, and
// the ranges are package shardmap's.
package rangemove

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/shardmap"
)

// ErrUnfinishedApply means a shard holds the state of an apply that stopped part-way, of
// another version than the one being applied.
var ErrUnfinishedApply = errors.New("an earlier shard map apply is unfinished")

// ErrApplyRunning means another ApplyMap (router migrate or router shardmap apply) holds the
// apply lock of a shard.
var ErrApplyRunning = errors.New("another shard map apply is running")

// MapDigest identifies what a map says about ownership: its version, and each shard's name and
// ranges (DSNs are left out: they are secret, and do not decide who owns what).
func MapDigest(m *shardmap.Map) string {
	owned := m.Ownership()
	names := make([]string, 0, len(m.Shards))
	for _, s := range m.Shards {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	h := sha256.New()
	fmt.Fprintf(h, "version %d\n", m.Version)
	for _, n := range names {
		rs := shardmap.SortRanges(slices.Clone(owned[n]))
		fmt.Fprintf(h, "%s %v\n", n, rs)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// MoveReport says what ApplyMap copied from one shard to another.
type MoveReport struct {
	From, To        string
	Range           shardmap.KeyRange // the part of a range From held that To now owns
	Records, Ledger int64             // rows inserted on To (by Plan: rows From holds there)
	// Credits counts owed-credit rows of debits in Range copied to To, which delivers those
	// still pending from then on.
	Credits int64
	// Conflicts counts keys To already held for a different request: the same key was used
	// for transfers from accounts on two shards. To's record wins; each is a key to look at.
	Conflicts int64
}

// ApplyMap makes the shards of m own exactly their ranges under m.Version, moving the rows of
// every key range that changes owner while its old owner keeps serving it: (1) every shard
// records that the apply has begun; (2) each moving range is copied to its new owner (bulk copy
// from a cursor stored on the old owner, then catch-up passes over the changes captured there
// since, see copyOnline) while the old owner serves it; (3) every shard revokes what it loses
// (the fence: those ranges are owned by nobody and their transfers get a retryable 503), and the
// last changes are copied; (4) every shard grants its new ranges; (5) every shard lists its
// moved ranges to purge, and (6) deletes their rows in small batches (idem.PurgeMoved). So a
// retry of a key completed before or during the move replays on the new owner instead of
// applying again. If any step fails nothing later runs; running ApplyMap again resumes where it
// stopped, and so does applying a newer map, while an older one is refused. One ApplyMap runs
// at a time: it holds an apply lock on every shard of m throughout, and fails at once with
// ErrApplyRunning if another holds one. pool must return a pool for every shard of m, with a
// connection to spare for the lock; iv is the partition interval, used to create partitions
// for copied records.
//
// A shard missing from m is not touched: remove a shard only after a map without its ranges
// has been applied.
func ApplyMap(ctx context.Context, m *shardmap.Map, pool func(shard string) *pgxpool.Pool, iv partition.Interval) ([]MoveReport, error) {
	return Apply(ctx, m, pool, Options{Interval: iv})
}

// Apply is ApplyMap with options: progress reports, and when the catch-up ends.
func Apply(ctx context.Context, m *shardmap.Map, pool func(shard string) *pgxpool.Pool, opts Options) ([]MoveReport, error) {
	if err := idem.CheckPace(opts.Pace); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	unlock, err := takeApplyLocks(ctx, m, pool)
	if err != nil {
		return nil, err
	}
	defer unlock()
	stale, err := checkHolders(ctx, m, pool)
	if err != nil {
		return nil, err
	}
	// Finish the settle an earlier apply left undone, before its moving ranges could be mistaken
	// for this apply's.
	for _, name := range stale {
		if err := idem.SettleStale(ctx, pool(name)); err != nil {
			return nil, fmt.Errorf("shard %s: settle the unfinished earlier apply: %w", name, err)
		}
	}
	// Rows an earlier apply moved away, and left to delete, go before anything moves.
	if err := purge(ctx, m, pool, opts, nil); err != nil {
		return nil, err
	}
	owned := m.Ownership()
	digest := MapDigest(m)
	apply := func(phase idem.Phase) error {
		for _, s := range m.Shards {
			o := idem.Ownership{Shard: s.Name, MapVersion: m.Version, Ranges: owned[s.Name], Digest: digest}
			if err := idem.ApplyOwnership(ctx, pool(s.Name), o, phase); err != nil {
				return fmt.Errorf("shard %s: apply ownership of map version %d: %w", s.Name, m.Version, err)
			}
		}
		return nil
	}
	planned, err := plan(ctx, m, pool)
	if err != nil {
		return nil, err
	}
	if err := dropStaleMoves(ctx, m, pool, planned); err != nil {
		return nil, err
	}
	// Copy while the old owners serve, once every shard knows this apply has begun.
	if err := apply(idem.Begin); err != nil {
		return nil, err
	}
	moves := make([]MoveReport, len(planned))
	copy(moves, planned)
	for i := range moves {
		mv := &moves[i]
		if err := copyOnline(ctx, pool(mv.From), pool(mv.To), mv, m.Version, opts); err != nil {
			return moves, fmt.Errorf("copy %s from %s to %s: %w", mv.Range, mv.From, mv.To, err)
		}
	}
	fenced, err := fence(ctx, moves, pool, opts, func() error { return apply(idem.Revoke) })
	if err != nil {
		return moves, err
	}
	if err := apply(idem.Grant); err != nil {
		return moves, err
	}
	for _, mv := range moves {
		opts.report(Progress{Phase: PhaseGranted, From: mv.From, To: mv.To, Range: mv.Range, Fenced: time.Since(fenced)})
	}
	if err := apply(idem.Settle); err != nil {
		return moves, err
	}
	return moves, purge(ctx, m, pool, opts, moves)
}

// fence revokes the moving ranges on every shard (revoke) and brings each new owner up to every
// change behind that fence, returning when the fence began. Each move says it is fenced first,
// so that an apply stopped inside the fence is seen as fenced.
func fence(ctx context.Context, moves []MoveReport, pool func(shard string) *pgxpool.Pool, opts Options, revoke func() error) (time.Time, error) {
	for _, mv := range moves {
		if _, err := pool(mv.From).Exec(ctx, "UPDATE shardgate_range_move SET phase = $2, updated_at = now() WHERE key_range = $1",
			mv.Range.String(), PhaseFenced); err != nil {
			return time.Time{}, fmt.Errorf("shard %s: %w", mv.From, err)
		}
	}
	if err := revoke(); err != nil {
		return time.Time{}, err
	}
	fenced := time.Now()
	hook("fenced")
	if opts.OnFenced != nil {
		if err := opts.OnFenced(); err != nil {
			return fenced, err
		}
	}
	for i := range moves {
		mv := &moves[i]
		if err := finishMove(ctx, pool(mv.From), pool(mv.To), mv, opts, fenced); err != nil {
			return fenced, fmt.Errorf("copy %s from %s to %s: %w", mv.Range, mv.From, mv.To, err)
		}
	}
	return fenced, nil
}

// PurgeBatch is how many rows of a moved range one purge transaction deletes on its old owner.
// The rows are ones no transfer reads, but deleting them writes WAL (a full page image of each
// page after a checkpoint), and a transfer committing beside a batch waits for that WAL to be
// flushed before its own: the batch bounds that wait. At 5,000 rows the other ranges' p99 during
// the purge of 1,000,000 transfers was 15.7–19.4 ms (6.1–7.2 ms before the move); at 1,000 it
// was 9.6 ms, and the purge took 42 s instead of 32–35 s (docs/operations.md).
const PurgeBatch = 1000

// purge deletes, on every shard of m, the rows of ranges that moved away from it
// (idem.PurgeMoved), reporting progress on the moves of this apply, and drops the change capture
// of a shard that no longer lists a move (the settle forgets finished moves).
func purge(ctx context.Context, m *shardmap.Map, pool func(string) *pgxpool.Pool, opts Options, moves []MoveReport) error {
	for _, s := range m.Shards {
		if _, err := idem.DropIdleCapture(ctx, pool(s.Name)); err != nil {
			return fmt.Errorf("shard %s: drop the change capture of finished moves: %w", s.Name, err)
		}
		n, err := idem.PurgeMoved(ctx, pool(s.Name), PurgeBatch, opts.Pace)
		if err != nil {
			return fmt.Errorf("shard %s: delete the rows of ranges moved away: %w", s.Name, err)
		}
		for _, mv := range moves {
			if mv.From == s.Name {
				opts.report(Progress{Phase: PhasePurging, From: mv.From, To: mv.To, Range: mv.Range, Purged: n})
			}
		}
	}
	return nil
}

// plan lists the moves m makes: every part of a range a shard holds (active or moving) that
// another shard of m owns, with the rows still to be counted or copied.
func plan(ctx context.Context, m *shardmap.Map, pool func(string) *pgxpool.Pool) ([]MoveReport, error) {
	owned := m.Ownership()
	var moves []MoveReport
	for _, from := range m.Shards {
		o, err := idem.ReadOwnership(ctx, pool(from.Name))
		if err != nil {
			return nil, fmt.Errorf("shard %s: %w", from.Name, err)
		}
		for _, r := range append(o.Ranges, o.Moving...) {
			for _, to := range m.Shards {
				if to.Name == from.Name {
					continue
				}
				for _, q := range owned[to.Name] {
					if part, ok := r.Intersect(q); ok {
						moves = append(moves, MoveReport{From: from.Name, To: to.Name, Range: part})
					}
				}
			}
		}
	}
	return moves, nil
}

// Plan says what ApplyMap(m) would do, and changes nothing: it refuses what ApplyMap would
// refuse before starting, and otherwise returns the moves, each with the rows From holds in
// its range now (Conflicts is not known before the copy).
func Plan(ctx context.Context, m *shardmap.Map, pool func(shard string) *pgxpool.Pool) ([]MoveReport, error) {
	if _, err := checkHolders(ctx, m, pool); err != nil {
		return nil, err
	}
	moves, err := plan(ctx, m, pool)
	if err != nil {
		return nil, err
	}
	for i, mv := range moves {
		lo, hi := idem.Bounds(mv.Range)
		err := pool(mv.From).QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_record WHERE `+inRange+`),
			(SELECT count(*) FROM ledger_entries WHERE `+inRange+`),
			(SELECT count(*) FROM shardgate_credit_outbox WHERE `+inRange+`)`, lo, hi).Scan(&moves[i].Records, &moves[i].Ledger, &moves[i].Credits)
		if err != nil {
			return nil, fmt.Errorf("shard %s: %w", mv.From, err)
		}
	}
	return moves, nil
}

// checkHolders refuses, before anything is changed, an apply that would lose track of rows or go
// back: a shard whose DSN reaches the database of another shard; a shard that follows, or has
// begun applying, a newer map; a shard where the apply of another version stopped part-way; a
// shard that follows this version with other ranges; or, once the cluster has been given ownership, key ranges that no
// shard of m holds (active or moving; copied ranges do not count) — they are held by a shard
// missing from m, whose rows would be left behind and whose keys would then apply a second time
// on their new owner.
func checkHolders(ctx context.Context, m *shardmap.Map, pool func(string) *pgxpool.Pool) (stale []string, err error) {
	owned := m.Ownership()
	digest := MapDigest(m)
	all := make([]idem.Ownership, len(m.Shards))
	for i, s := range m.Shards {
		if all[i], err = idem.ReadOwnership(ctx, pool(s.Name)); err != nil {
			return nil, fmt.Errorf("shard %s: %w", s.Name, err)
		}
	}
	var held []shardmap.KeyRange
	initialized := false
	for i, s := range m.Shards {
		o := all[i]
		if err := refuseOver(o, s.Name, m.Version, digest, owned[s.Name]); err != nil {
			return nil, err
		}
		settle, holds, err := holdings(o, s.Name, m.Version, activeElsewhere(all, i))
		if err != nil {
			return nil, err
		}
		if settle {
			stale = append(stale, s.Name)
		}
		held = append(held, holds...)
		// A shard that has begun an apply, or holds any range, is part of a cluster already.
		initialized = initialized || o.MapVersion > 0 || o.Applying > 0 ||
			len(o.Ranges)+len(o.Moving)+len(o.Copied) > 0
	}
	if !initialized {
		return stale, nil // a new cluster: nothing is held anywhere yet
	}
	if !shardmap.Covers(shardmap.SortRanges(held), shardmap.KeyRange{}) {
		return nil, errors.New("some key ranges are held by no shard of this map: a shard removed from the map still owns them, " +
			"or an apply that stopped has not granted them yet. Apply the stopped map again to finish it; " +
			"to remove a shard, put it back with `ranges: []`, apply (its rows move to their new owners), and only then remove it")
	}
	return stale, nil
}

// activeElsewhere is the union of the ranges the shards other than all[i] are active on.
func activeElsewhere(all []idem.Ownership, i int) []shardmap.KeyRange {
	var rs []shardmap.KeyRange
	for j, o := range all {
		if j != i {
			rs = append(rs, o.Ranges...)
		}
	}
	return shardmap.SortRanges(rs)
}

// refuseOver refuses applying map version (with digest, giving the shard ranges) over what the
// shard o records: another shard's database, a newer map, or the same version with other
// contents.
func refuseOver(o idem.Ownership, name string, version int64, digest string, ranges []shardmap.KeyRange) error {
	if o.Shard != "" && o.Shard != name {
		return fmt.Errorf("shard %s: its DSN reaches the database of shard %s; fix the DSN", name, o.Shard)
	}
	// Refused here, before any shard is revoked: a revoke of this map on some shards would
	// leave their ranges owned by nobody until the newer map is applied.
	if newest := max(o.MapVersion, o.Applying); newest > version {
		return fmt.Errorf("shard %s: %w: it follows or has begun applying version %d, and this map is version %d; apply version %d or newer",
			name, idem.ErrOlderMap, newest, version, newest)
	}
	// The same version with other contents, even on shards this map leaves out of its ranges,
	// or leaves out altogether (seen on the others): two maps under one version could give one
	// range to two shards.
	if o.Applying == version && o.Digest != "" && o.Digest != digest {
		return fmt.Errorf("shard %s: %w: version %d was applied, or begun, with another map (other shards or ranges); apply that exact map, or raise the version",
			name, idem.ErrChangedMap, version)
	}
	if o.MapVersion == version && !shardmap.SameRanges(o.Ranges, ranges) {
		return fmt.Errorf("shard %s: %w: it owns %v at version %d, the map gives it %v; raise the version",
			name, idem.ErrChangedMap, o.Ranges, version, ranges)
	}
	return nil
}

// holdings says what shard o holds for an apply of version, and whether an earlier apply left
// it to settle first. An apply stopped before its grant, of another version, is refused.
func holdings(o idem.Ownership, name string, version int64, elsewhere []shardmap.KeyRange) (settle bool, held []shardmap.KeyRange, err error) {
	switch {
	case o.Applying > o.MapVersion && o.Applying != version && len(o.Ranges) == 0 && len(o.Copied) == 0 &&
		shardmap.CoversAll(elsewhere, o.Moving):
		// Revoked, not granted, and drained: every range it gave up is active elsewhere, which
		// takes a grant, and an apply grants only after all its copies. So its rows are copies
		// others hold (a drain stopped before this shard's grant): settle it. A shard holding
		// copied ranges was to be granted them: it is no drain.
		return true, nil, nil
	case o.Applying > o.MapVersion && o.Applying != version:
		// Revoked and not granted: the copies of that apply may be incomplete, so only the same
		// map may go on from here.
		return false, nil, fmt.Errorf("shard %s: %w: the apply of version %d stopped before its grant; apply that map again to finish it, then this one",
			name, ErrUnfinishedApply, o.Applying)
	case o.SettlePending() && o.Applying != version:
		// Granted and not settled: its moving rows are copies their new owners hold, so they are
		// not held here; this apply settles them first.
		return true, o.Ranges, nil
	}
	return false, append(slices.Clone(o.Ranges), o.Moving...), nil
}

// takeApplyLocks takes the apply lock (a session advisory lock) on every shard of m, in name order,
// each on a connection held until unlock. It fails at once, holding nothing, if a shard's lock is
// taken: two applies that interleaved their phases could leave two shards owning one range. A
// lock held by this very apply means two shards' DSNs reach one database, and says so.
func takeApplyLocks(ctx context.Context, m *shardmap.Map, pool func(string) *pgxpool.Pool) (unlock func(), err error) {
	type session struct {
		shard string
		conn  *pgxpool.Conn
		id    string // backend pid and start time: unique on a server, and across servers in practice
	}
	var held []session
	unlock = func() {
		for _, s := range held {
			if _, err := s.conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1, $2)", idem.LockClass, idem.LockApply); err != nil {
				// The pool must not keep a session that may still hold the lock.
				s.conn.Conn().Close(context.WithoutCancel(ctx)) //nolint:errcheck // closing is the fallback
			}
			s.conn.Release()
		}
	}
	names := make([]string, 0, len(m.Shards))
	for _, s := range m.Shards {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	const backend = "pg_backend_pid() || '@' || (SELECT extract(epoch FROM backend_start) FROM pg_stat_activity WHERE pid = pg_backend_pid())"
	for _, name := range names {
		c, err := pool(name).Acquire(ctx)
		if err != nil {
			unlock()
			return nil, fmt.Errorf("shard %s: %w", name, err)
		}
		var ok bool
		var id string
		err = c.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2), "+backend, idem.LockClass, idem.LockApply).Scan(&ok, &id)
		if err == nil && !ok {
			err = fmt.Errorf("%w there (router migrate or router shardmap apply); wait for it to finish, then run this again", ErrApplyRunning)
			var holder *string
			if qerr := c.QueryRow(ctx, `SELECT a.pid || '@' || extract(epoch FROM a.backend_start) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE l.locktype = 'advisory' AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 2 AND l.granted
				  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`, idem.LockClass, idem.LockApply).Scan(&holder); qerr == nil && holder != nil {
				for _, h := range held {
					if h.id == *holder {
						err = fmt.Errorf("its DSN reaches the database of shard %s; fix the DSN", h.shard)
					}
				}
			}
		}
		if err != nil {
			c.Release()
			unlock()
			return nil, fmt.Errorf("shard %s: %w", name, err)
		}
		held = append(held, session{shard: name, conn: c, id: id})
	}
	return unlock, nil
}

// copyRange copies the idempotency records, ledger rows and owed credits whose keyspace id is in
// r from src to dst, skipping rows dst already has, so it can run again after an interruption:
// the bulk copy of a move without a stored cursor. dst serves its other ranges meanwhile: each record is inserted under its key's lock
// (shardgate_copy_records), so a transfer there reusing the key cannot add a second record.
// Each transaction also lists r on dst as a copied range, so rows copied by an apply that never
// reaches its grant are deleted when a later apply settles, instead of being left behind; a
// copied range is not held, so it cannot stand in for the shard the rows were copied from.
func copyRange(ctx context.Context, src, dst *pgxpool.Pool, r shardmap.KeyRange, iv partition.Interval, mv *MoveReport) error {
	if err := ensureCopyPartitions(ctx, src, dst, r, iv); err != nil {
		return err
	}
	// Each table in keyset batches over its keyspace index: a batch reads its own rows only.
	for i := range tables {
		if done, err := tables[i].copyAll(ctx, src, dst, r, nil, mv, 0, nil); err != nil || done {
			return err
		}
	}
	return nil
}

// ensureCopyPartitions creates on dst the partitions that the records of r on src are copied
// into.
func ensureCopyPartitions(ctx context.Context, src, dst *pgxpool.Pool, r shardmap.KeyRange, iv partition.Interval) error {
	lo, hi := idem.Bounds(r)
	var oldest, newest *time.Time
	// A record is copied dated no earlier than its key's floor (shardgate_copy_records): one
	// written before migration 0006 may land later than its date here.
	if err := src.QueryRow(ctx, "SELECT min(created_at), max(greatest(created_at, shardgate_key_floor(key))) FROM idempotency_record WHERE "+inRange, lo, hi).Scan(&oldest, &newest); err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "42883" {
			return fmt.Errorf("the source shard has no shardgate_key_floor: migrate every shard (router migrate) before moving ranges: %w", err)
		}
		return err
	}
	if oldest != nil {
		n := 0
		for p := partition.At(iv, *oldest); p.To.Before(*newest) || p.To.Equal(*newest); p = partition.At(iv, p.To) {
			n++
		}
		if _, err := idem.EnsurePartitions(ctx, dst, iv, *oldest, n); err != nil {
			return fmt.Errorf("partitions for copied records: %w", err)
		}
	}
	return nil
}
