package idem

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/shardmap"
)

// ErrOlderMap means a shard already follows a newer shard map than the one being applied.
var ErrOlderMap = errors.New("shard already follows a newer shard map")

// ErrChangedMap means a shard follows the map's version already, with other ranges: the map was
// changed without raising its version.
var ErrChangedMap = errors.New("shard map changed without a new version")

// sameRanges reports whether a and b hold the same ranges, in any order.
func sameRanges(a, b []shardmap.KeyRange) bool {
	if len(a) != len(b) {
		return false
	}
	for _, r := range a {
		if !containsRange(b, r) {
			return false
		}
	}
	return true
}

// Ownership is what one shard owns at one shard map version.
type Ownership struct {
	Shard      string
	MapVersion int64
	Ranges     []shardmap.KeyRange // active: transfers in them are applied here
	Moving     []shardmap.KeyRange // revoked, rows not yet handed to their new owner
}

// ReadOwnership returns what the shard behind pool believes it owns. A shard that was never
// given ownership returns MapVersion 0 and no ranges.
func ReadOwnership(ctx context.Context, pool *pgxpool.Pool) (Ownership, error) {
	var o Ownership
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		o, err = readOwnership(ctx, tx)
		return err
	})
	return o, err
}

func readOwnership(ctx context.Context, tx pgx.Tx) (Ownership, error) {
	var o Ownership
	err := tx.QueryRow(ctx, "SELECT shard_name, map_version FROM shardgate_shard").Scan(&o.Shard, &o.MapVersion)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return o, err
	}
	rows, err := tx.Query(ctx, "SELECT key_range, active FROM shardgate_owned_range ORDER BY lo")
	if err != nil {
		return o, err
	}
	var (
		spec   string
		active bool
	)
	_, err = pgx.ForEachRow(rows, []any{&spec, &active}, func() error {
		r, err := shardmap.ParseKeyRange(spec)
		if err != nil {
			return fmt.Errorf("shardgate_owned_range holds %q: %w", spec, err)
		}
		if active {
			o.Ranges = append(o.Ranges, r)
		} else {
			o.Moving = append(o.Moving, r)
		}
		return nil
	})
	return o, err
}

// Phase is one step of moving ownership to a new shard map. ApplyMap runs each on every shard
// before the next, so no key range is ever owned by two shards at once.
type Phase int

// The phases of ApplyMap, in order.
const (
	// Revoke keeps active only the new ranges the shard already owns; every other range it owned
	// stays listed as moving, so its rows can still be found and copied.
	Revoke Phase = iota + 1
	// Grant makes the shard own exactly the new ranges.
	Grant
	// Settle deletes the rows of moving ranges, which their new owners now hold, and forgets
	// the moving ranges.
	Settle
)

// ApplyOwnership runs one phase of applying o (Shard, MapVersion, Ranges) on the shard behind
// pool. It takes the ownership lock exclusively, so it waits for transfers already past their
// ownership check (they hold it shared): once it returns, no transfer outside the new active
// ranges can commit there. A version lower than the shard's is refused with ErrOlderMap; the
// same version is accepted, so an interrupted apply can simply be run again.
func ApplyOwnership(ctx context.Context, pool *pgxpool.Pool, o Ownership, phase Phase) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", lockClass, lockOwnership); err != nil {
			return err
		}
		cur, err := readOwnership(ctx, tx)
		if err != nil {
			return err
		}
		if cur.MapVersion > o.MapVersion {
			return fmt.Errorf("%w: shard %s is at version %d, refusing version %d", ErrOlderMap, o.Shard, cur.MapVersion, o.MapVersion)
		}
		if phase == Revoke && cur.MapVersion == o.MapVersion && !sameRanges(cur.Ranges, o.Ranges) {
			// The shard was granted this version already, with other ranges: routers would keep
			// the old map (they refuse a changed map under the same version) and never agree.
			return fmt.Errorf("%w: shard %s owns %v at version %d, the map gives it %v; raise the version", ErrChangedMap, o.Shard, cur.Ranges, o.MapVersion, o.Ranges)
		}
		// A revoke keeps the shard's version: only a grant says the shard follows the new map,
		// so a resumed apply is told apart from a changed map under the same version.
		version := o.MapVersion
		if phase == Revoke {
			version = cur.MapVersion
		}
		if phase == Settle {
			if err := deleteMovedRows(ctx, tx); err != nil {
				return err
			}
		}
		active, moving := o.Ranges, cur.Moving
		switch phase {
		case Revoke:
			active = nil
			for _, r := range o.Ranges {
				if covers(cur.Ranges, r) {
					active = append(active, r)
				}
			}
			for _, r := range cur.Ranges {
				if !containsRange(active, r) {
					moving = append(moving, r)
				}
			}
		case Settle:
			moving = nil
		}
		if _, err := tx.Exec(ctx, "DELETE FROM shardgate_owned_range"); err != nil {
			return err
		}
		for _, set := range []struct {
			ranges []shardmap.KeyRange
			active bool
		}{{active, true}, {moving, false}} {
			for _, r := range set.ranges {
				lo, hi := bounds(r)
				if _, err := tx.Exec(ctx, `INSERT INTO shardgate_owned_range (key_range, lo, hi, active) VALUES ($1, $2, $3, $4)
					ON CONFLICT (key_range) DO UPDATE SET active = shardgate_owned_range.active OR EXCLUDED.active`,
					r.String(), lo, hi, set.active); err != nil {
					return err
				}
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO shardgate_shard (shard_name, map_version) VALUES ($1, $2)
			ON CONFLICT (singleton) DO UPDATE SET shard_name = EXCLUDED.shard_name,
				map_version = EXCLUDED.map_version, updated_at = now()`, o.Shard, version)
		return err
	})
}

// inRangeOf is true for a row whose keyspace_id lies in an owned range with the given activity.
const inRangeOf = `EXISTS (SELECT 1 FROM shardgate_owned_range o
	WHERE o.active = %t AND t.keyspace_id >= o.lo AND (o.hi IS NULL OR t.keyspace_id < o.hi))`

// deleteMovedRows removes the rows of ranges that moved away, once their new owners hold
// copies: left behind they would count a moved transfer twice in any sum over shards.
func deleteMovedRows(ctx context.Context, tx pgx.Tx) error {
	for _, table := range []string{"idempotency_record", "ledger_entries"} {
		q := fmt.Sprintf("DELETE FROM %s t WHERE %s AND NOT %s", table, fmt.Sprintf(inRangeOf, false), fmt.Sprintf(inRangeOf, true))
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("delete moved rows from %s: %w", table, err)
		}
	}
	return nil
}

// bounds returns r's bounds as stored: sign-flipped, hi nil when r runs to the end.
func bounds(r shardmap.KeyRange) (lo int64, hi *int64) {
	if end, bounded := r.Hi(); bounded {
		v := signedKeyspace(end)
		hi = &v
	}
	return signedKeyspace(r.Lo()), hi
}

func containsRange(set []shardmap.KeyRange, r shardmap.KeyRange) bool {
	for _, s := range set {
		if s == r {
			return true
		}
	}
	return false
}

// covers reports whether the union of set (sorted by Lo) contains r.
func covers(set []shardmap.KeyRange, r shardmap.KeyRange) bool {
	next := r.Lo() // first keyspace id of r not yet known to be covered
	rEnd, rBounded := r.Hi()
	for _, s := range set {
		if s.Lo() > next {
			break
		}
		sEnd, sBounded := s.Hi()
		if !sBounded {
			return true
		}
		if sEnd > next {
			next = sEnd
		}
		if rBounded && next >= rEnd {
			return true
		}
	}
	return false
}

// MoveReport says what ApplyMap copied from one shard to another.
type MoveReport struct {
	From, To        string
	Range           shardmap.KeyRange // the moving range on From (may be wider than what To gets)
	Records, Ledger int64             // rows inserted on To
}

// ApplyMap makes the shards of m own exactly their ranges under m.Version, moving the rows of
// every key range that changes owner: (1) every shard revokes what it loses, so those ranges
// are owned by nobody and their transfers get a retryable 503; (2) the idempotency records and
// ledger rows of each revoked range are copied to the shards that now own it, so a retry there
// replays instead of applying again; (3) every shard grants its new ranges; (4) every shard
// forgets its moving ranges. If any step fails nothing later runs; running ApplyMap again
// resumes. pool must return a pool for every shard of m; iv is the partition interval, used to
// create partitions for copied records.
//
// A shard missing from m is not touched: remove a shard only after a map without its ranges
// has been applied.
func ApplyMap(ctx context.Context, m *shardmap.Map, pool func(shard string) *pgxpool.Pool, iv Interval) ([]MoveReport, error) {
	if err := checkHolders(ctx, m, pool); err != nil {
		return nil, err
	}
	owned := m.Ownership()
	apply := func(phase Phase) error {
		for _, s := range m.Shards {
			o := Ownership{Shard: s.Name, MapVersion: m.Version, Ranges: owned[s.Name]}
			if err := ApplyOwnership(ctx, pool(s.Name), o, phase); err != nil {
				return fmt.Errorf("shard %s: apply ownership of map version %d: %w", s.Name, m.Version, err)
			}
		}
		return nil
	}
	if err := apply(Revoke); err != nil {
		return nil, err
	}
	var moves []MoveReport
	for _, from := range m.Shards {
		o, err := ReadOwnership(ctx, pool(from.Name))
		if err != nil {
			return moves, fmt.Errorf("shard %s: %w", from.Name, err)
		}
		for _, r := range o.Moving {
			for _, to := range m.Shards {
				if to.Name == from.Name {
					continue
				}
				for _, q := range owned[to.Name] {
					lo, hi, ok := intersect(r, q)
					if !ok {
						continue
					}
					mv := MoveReport{From: from.Name, To: to.Name, Range: r}
					if err := copyRange(ctx, pool(from.Name), pool(to.Name), lo, hi, iv, &mv); err != nil {
						return moves, fmt.Errorf("copy %s from %s to %s: %w", r, from.Name, to.Name, err)
					}
					moves = append(moves, mv)
				}
			}
		}
	}
	if err := apply(Grant); err != nil {
		return moves, err
	}
	return moves, apply(Settle)
}

// checkHolders refuses an apply that would lose track of rows: a shard whose DSN reaches the
// database of another shard, or, once the cluster has been given ownership, key ranges that no
// shard of m holds (active or moving) — they are held by a shard missing from m, whose rows
// would be left behind and whose keys would then apply a second time on their new owner.
func checkHolders(ctx context.Context, m *shardmap.Map, pool func(string) *pgxpool.Pool) error {
	var held []shardmap.KeyRange
	initialized := false
	for _, s := range m.Shards {
		o, err := ReadOwnership(ctx, pool(s.Name))
		if err != nil {
			return fmt.Errorf("shard %s: %w", s.Name, err)
		}
		if o.Shard != "" && o.Shard != s.Name {
			return fmt.Errorf("shard %s: its DSN reaches the database of shard %s; fix the DSN", s.Name, o.Shard)
		}
		initialized = initialized || o.MapVersion > 0
		held = append(held, o.Ranges...)
		held = append(held, o.Moving...)
	}
	if !initialized {
		return nil // a new cluster: nothing is held anywhere yet
	}
	sort.Slice(held, func(i, j int) bool { return held[i].Lo() < held[j].Lo() })
	if !covers(held, shardmap.KeyRange{}) {
		return errors.New("some key ranges are held by no shard of this map: a shard removed from the map still owns them. " +
			"Put it back with `ranges: []`, apply (its rows move to their new owners), and only then remove it")
	}
	return nil
}

// intersect returns the stored (sign-flipped) bounds of a ∩ b; hi nil means to the end.
func intersect(a, b shardmap.KeyRange) (lo int64, hi *int64, ok bool) {
	alo, ahi := bounds(a)
	blo, bhi := bounds(b)
	lo = max(alo, blo)
	switch {
	case ahi == nil:
		hi = bhi
	case bhi == nil:
		hi = ahi
	default:
		v := min(*ahi, *bhi)
		hi = &v
	}
	return lo, hi, hi == nil || lo < *hi
}

// copyRange copies the idempotency records and ledger rows whose keyspace id is in [lo, hi)
// from src to dst, skipping rows dst already has, so it can run again after an interruption.
// It runs while nobody owns the range, so no transfer writes those keys meanwhile.
func copyRange(ctx context.Context, src, dst *pgxpool.Pool, lo int64, hi *int64, iv Interval, mv *MoveReport) error {
	const inRange = "keyspace_id >= $1 AND ($2::bigint IS NULL OR keyspace_id < $2)"
	var oldest, newest *time.Time
	if err := src.QueryRow(ctx, "SELECT min(created_at), max(created_at) FROM idempotency_record WHERE "+inRange, lo, hi).Scan(&oldest, &newest); err != nil {
		return err
	}
	if oldest != nil {
		n := 0
		for p := PartitionAt(iv, *oldest); p.To.Before(*newest) || p.To.Equal(*newest); p = PartitionAt(iv, p.To) {
			n++
		}
		if _, err := EnsurePartitions(ctx, dst, iv, *oldest, n); err != nil {
			return fmt.Errorf("partitions for copied records: %w", err)
		}
	}
	return pgx.BeginFunc(ctx, dst, func(tx pgx.Tx) error {
		// A destination already serving the range (an apply run again after its grant) has its
		// copy: copying again could race its own transfers.
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1, $2)", lockClass, lockOwnership); err != nil {
			return err
		}
		var serving bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM shardgate_owned_range
			WHERE active AND ($2::bigint IS NULL OR lo < $2) AND (hi IS NULL OR hi > $1))`, lo, hi).Scan(&serving); err != nil {
			return err
		}
		if serving {
			return nil
		}
		steps := []struct {
			table, cols, insert string
			count               *int64
		}{
			{"idempotency_record", "key, scope, request_hash, keyspace_id, response, state, created_at",
				`INSERT INTO idempotency_record (%[1]s) SELECT %[1]s FROM moving_rows m
				 WHERE NOT EXISTS (SELECT 1 FROM idempotency_record r WHERE r.scope = m.scope AND r.key = m.key)`, &mv.Records},
			{"ledger_entries", "transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client, created_at",
				`INSERT INTO ledger_entries (%[1]s) SELECT %[1]s FROM moving_rows ON CONFLICT (transfer_id, kind) DO NOTHING`, &mv.Ledger},
		}
		for _, st := range steps {
			if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE TEMP TABLE moving_rows ON COMMIT DROP AS SELECT %s FROM %s WITH NO DATA", st.cols, st.table)); err != nil {
				return err
			}
			rows, err := src.Query(ctx, fmt.Sprintf("SELECT %s FROM %s WHERE %s", st.cols, st.table, inRange), lo, hi)
			if err != nil {
				return err
			}
			_, err = tx.CopyFrom(ctx, pgx.Identifier{"moving_rows"}, splitCols(st.cols), pgx.CopyFromFunc(func() ([]any, error) {
				if !rows.Next() {
					return nil, rows.Err()
				}
				return rows.Values()
			}))
			rows.Close()
			if err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, fmt.Sprintf(st.insert, st.cols))
			if err != nil {
				return err
			}
			*st.count = tag.RowsAffected()
			if _, err := tx.Exec(ctx, "DROP TABLE moving_rows"); err != nil {
				return err
			}
		}
		return nil
	})
}

func splitCols(cols string) []string {
	parts := strings.Split(cols, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}
