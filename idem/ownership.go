package idem

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/shardmap"
)

// ErrOlderMap means a shard already follows a newer shard map than the one being applied.
var ErrOlderMap = errors.New("shard already follows a newer shard map")

// ErrChangedMap means a shard follows the map's version already, with other ranges: the map was
// changed without raising its version.
var ErrChangedMap = errors.New("shard map changed without a new version")

// Ownership is what one shard owns at one shard map version.
type Ownership struct {
	Shard      string
	MapVersion int64
	Ranges     []shardmap.KeyRange // active: transfers in them are applied here
	// Moving ranges were revoked: their rows here are not yet handed to their new owner.
	Moving []shardmap.KeyRange
	// Copied ranges hold rows copied here ahead of a grant that has not happened (yet). They
	// are not held: the shard they were copied from still answers for them. Settle lists the
	// moving and copied ranges that no active range covers for PurgeMoved to delete their rows.
	Copied []shardmap.KeyRange
	// Applying is the newest map version whose apply has begun on the shard; phases of older
	// versions are refused from then on. Digest is MapDigest of that map, so the same version
	// with other contents is told apart (empty when written by ApplyOwnership without one).
	Applying int64
	Digest   string
}

// SettlePending reports a shard granted the map it was applying but not yet settled: its moving
// rows are copies its new owners hold (every copy of an apply ends before its first grant).
func (o Ownership) SettlePending() bool {
	return o.MapVersion == o.Applying && (len(o.Moving) > 0 || len(o.Copied) > 0)
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
	err := tx.QueryRow(ctx, "SELECT shard_name, map_version, applying_version, applying_digest FROM shardgate_shard").Scan(&o.Shard, &o.MapVersion, &o.Applying, &o.Digest)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return o, err
	}
	rows, err := tx.Query(ctx, "SELECT key_range, active, copied FROM shardgate_owned_range ORDER BY lo")
	if err != nil {
		return o, err
	}
	var (
		spec           string
		active, copied bool
	)
	_, err = pgx.ForEachRow(rows, []any{&spec, &active, &copied}, func() error {
		r, err := shardmap.ParseKeyRange(spec)
		if err != nil {
			return fmt.Errorf("shardgate_owned_range holds %q: %w", spec, err)
		}
		switch {
		case active:
			o.Ranges = append(o.Ranges, r)
		case copied:
			o.Copied = append(o.Copied, r)
		default:
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
	// Begin changes no range: it records on the shard that the apply of the map has begun
	// (Applying), so the copies made for it while the old owners still serve their ranges are
	// told apart from those of an apply that stopped earlier, and an older map is refused.
	Begin Phase = iota + 1
	// Revoke keeps active only the new ranges the shard already owns; every other range it owned
	// stays listed as moving, so its rows can still be found and copied.
	Revoke
	// Grant makes the shard own exactly the new ranges; an active range it no longer owns
	// (which a revoke of the same version would already have made moving) is kept as moving.
	Grant
	// Settle lists the moving and copied ranges (whose rows their new owners now hold, or which
	// were copied here for nothing) as ranges to purge, and forgets them; PurgeMoved then
	// deletes their rows in small batches.
	Settle
)

// ApplyOwnership runs one phase of applying o (Shard, MapVersion, Ranges) on the shard behind
// pool. It takes the ownership lock exclusively, so it waits for transfers already past their
// ownership check (they hold it shared): once it returns, no transfer outside the new active
// ranges can commit there. A version lower than the shard's, or lower than one whose apply has
// begun there, is refused with ErrOlderMap; the same version is accepted, so an interrupted
// apply can simply be run again.
func ApplyOwnership(ctx context.Context, pool *pgxpool.Pool, o Ownership, phase Phase) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", LockClass, LockOwnership); err != nil {
			return err
		}
		cur, err := readOwnership(ctx, tx)
		if err != nil {
			return err
		}
		if err := checkPhase(cur, o, phase); err != nil {
			return err
		}
		if phase == Settle {
			if err := queuePurge(ctx, tx); err != nil {
				return err
			}
		}
		next := phaseResult(cur, o, phase)
		// A revoke keeps the shard's version: only a grant says the shard follows the new map,
		// so a resumed apply is told apart from a changed map under the same version.
		next.MapVersion = o.MapVersion
		if phase == Revoke || phase == Begin {
			next.MapVersion = cur.MapVersion
		}
		next.Shard, next.Applying, next.Digest = o.Shard, max(cur.Applying, o.MapVersion), o.Digest
		if o.MapVersion == cur.Applying && o.Digest == "" {
			next.Digest = cur.Digest
		}
		return writeOwnership(ctx, tx, next)
	})
}

// checkPhase refuses a phase of an older map than the shard follows or has begun applying, and
// a revoke of the shard's own version with other ranges.
func checkPhase(cur, o Ownership, phase Phase) error {
	if cur.MapVersion > o.MapVersion {
		return fmt.Errorf("%w: shard %s is at version %d, refusing version %d", ErrOlderMap, o.Shard, cur.MapVersion, o.MapVersion)
	}
	if cur.Applying > o.MapVersion {
		return fmt.Errorf("%w: the apply of version %d has begun on shard %s, refusing version %d; apply version %d or newer to finish it",
			ErrOlderMap, cur.Applying, o.Shard, o.MapVersion, cur.Applying)
	}
	if (phase == Revoke || phase == Begin) && cur.MapVersion == o.MapVersion && !shardmap.SameRanges(cur.Ranges, o.Ranges) {
		// The shard was granted this version already, with other ranges: routers would keep
		// the old map (they refuse a changed map under the same version) and never agree.
		return fmt.Errorf("%w: shard %s owns %v at version %d, the map gives it %v; raise the version", ErrChangedMap, o.Shard, cur.Ranges, o.MapVersion, o.Ranges)
	}
	return nil
}

// phaseResult is the shard's active, moving and copied ranges after phase.
func phaseResult(cur, o Ownership, phase Phase) Ownership {
	next := Ownership{Ranges: o.Ranges, Moving: cur.Moving, Copied: cur.Copied}
	switch phase {
	case Begin:
		next.Ranges = cur.Ranges
	case Revoke:
		next.Ranges = nil
		for _, r := range o.Ranges {
			if shardmap.Covers(cur.Ranges, r) {
				next.Ranges = append(next.Ranges, r)
			}
		}
		for _, r := range cur.Ranges {
			if !slices.Contains(next.Ranges, r) {
				next.Moving = append(next.Moving, r)
			}
		}
	case Grant:
		granted := shardmap.SortRanges(slices.Clone(o.Ranges))
		for _, r := range cur.Ranges {
			if !shardmap.Covers(granted, r) {
				next.Moving = append(next.Moving, r)
			}
		}
	case Settle:
		next.Moving, next.Copied = nil, nil
	}
	return next
}

// writeOwnership replaces the shard's ownership rows with o.
func writeOwnership(ctx context.Context, tx pgx.Tx, o Ownership) error {
	if _, err := tx.Exec(ctx, "DELETE FROM shardgate_owned_range"); err != nil {
		return err
	}
	// One row per range string: active wins over moving, and moving (held) over copied.
	for _, set := range []struct {
		ranges         []shardmap.KeyRange
		active, copied bool
	}{{o.Ranges, true, false}, {o.Moving, false, false}, {o.Copied, false, true}} {
		for _, r := range set.ranges {
			lo, hi := Bounds(r)
			if _, err := tx.Exec(ctx, `INSERT INTO shardgate_owned_range AS o (key_range, lo, hi, active, copied) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (key_range) DO UPDATE SET active = o.active OR EXCLUDED.active, copied = o.copied AND EXCLUDED.copied`,
				r.String(), lo, hi, set.active, set.copied); err != nil {
				return err
			}
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO shardgate_shard (shard_name, map_version, applying_version, applying_digest) VALUES ($1, $2, $3, $4)
		ON CONFLICT (singleton) DO UPDATE SET shard_name = EXCLUDED.shard_name, map_version = EXCLUDED.map_version,
			applying_version = EXCLUDED.applying_version, applying_digest = EXCLUDED.applying_digest, updated_at = now()`,
		o.Shard, o.MapVersion, o.Applying, o.Digest)
	return err
}

// Bounds returns r's bounds as stored: sign-flipped, hi nil when r runs to the end.
func Bounds(r shardmap.KeyRange) (lo int64, hi *int64) {
	if end, bounded := r.Hi(); bounded {
		v := signedKeyspace(end)
		hi = &v
	}
	return signedKeyspace(r.Lo()), hi
}

// SettleStale finishes the settle of an apply that was granted on this shard but not settled:
// it lists its inactive ranges to purge (PurgeMoved deletes their rows that no active range
// covers: their new owners hold copies) and forgets those ranges. Versions are left as they are.
func SettleStale(ctx context.Context, pool *pgxpool.Pool) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", LockClass, LockOwnership); err != nil {
			return err
		}
		if err := queuePurge(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "DELETE FROM shardgate_owned_range WHERE NOT active")
		return err
	})
}
