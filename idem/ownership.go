package idem

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/shardmap"
)

// ErrOlderMap means a shard already follows a newer shard map than the one being applied.
var ErrOlderMap = errors.New("shard already follows a newer shard map")

// Ownership is what one shard owns at one shard map version.
type Ownership struct {
	Shard      string
	MapVersion int64
	Ranges     []shardmap.KeyRange
}

// ReadOwnership returns what the shard behind pool believes it owns. A shard that was never
// given ownership returns MapVersion 0 and no ranges.
func ReadOwnership(ctx context.Context, pool *pgxpool.Pool) (Ownership, error) {
	var o Ownership
	err := pool.QueryRow(ctx, "SELECT shard_name, map_version FROM shardgate_shard").Scan(&o.Shard, &o.MapVersion)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return o, err
	}
	o.Ranges, err = ownedRanges(ctx, pool)
	return o, nil
}

// Phase is one half of moving ownership to a new shard map: every shard revokes before any
// shard grants, so no key range is ever owned by two shards at once.
type Phase int

// The phases of ApplyMap, in order.
const (
	Revoke Phase = iota + 1 // keep only the new ranges already owned: ownership shrinks
	Grant                   // own exactly the new ranges
)

// ApplyOwnership records on the shard behind pool what it owns under shard map o.MapVersion.
// In the Revoke phase the shard keeps only those of o.Ranges it already owns; in the Grant phase
// it owns exactly o.Ranges. It waits for transfers already past their ownership check (they hold
// the ownership lock shared), so once it returns no transfer outside the new ranges can commit
// there. A version lower than the shard's is refused with ErrOlderMap; the same version is
// accepted, so an interrupted apply can be run again.
func ApplyOwnership(ctx context.Context, pool *pgxpool.Pool, o Ownership, phase Phase) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", lockClass, lockOwnership); err != nil {
			return err
		}
		var current int64
		err := tx.QueryRow(ctx, "SELECT map_version FROM shardgate_shard").Scan(&current)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if current > o.MapVersion {
			return fmt.Errorf("%w: shard %s is at version %d, refusing version %d", ErrOlderMap, o.Shard, current, o.MapVersion)
		}
		ranges := o.Ranges
		if phase == Revoke {
			owned, err := ownedRanges(ctx, tx)
			if err != nil {
				return err
			}
			ranges = nil
			for _, r := range o.Ranges {
				if covers(owned, r) {
					ranges = append(ranges, r)
				}
			}
		}
		if _, err := tx.Exec(ctx, "DELETE FROM shardgate_owned_range"); err != nil {
			return err
		}
		for _, r := range ranges {
			var hi *int64
			if end, bounded := r.Hi(); bounded {
				v := signedKeyspace(end)
				hi = &v
			}
			if _, err := tx.Exec(ctx, "INSERT INTO shardgate_owned_range (key_range, lo, hi) VALUES ($1, $2, $3)",
				r.String(), signedKeyspace(r.Lo()), hi); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO shardgate_shard (shard_name, map_version) VALUES ($1, $2)
			ON CONFLICT (singleton) DO UPDATE SET shard_name = EXCLUDED.shard_name,
				map_version = EXCLUDED.map_version, updated_at = now()`, o.Shard, o.MapVersion)
		return err
	})
}

func ownedRanges(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}) ([]shardmap.KeyRange, error) {
	rows, err := q.Query(ctx, "SELECT key_range FROM shardgate_owned_range ORDER BY lo")
	if err != nil {
		return nil, err
	}
	specs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make([]shardmap.KeyRange, 0, len(specs))
	for _, s := range specs {
		r, err := shardmap.ParseKeyRange(s)
		if err != nil {
			return nil, fmt.Errorf("shardgate_owned_range holds %q: %w", s, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// covers reports whether the union of set (sorted by Lo, as ownedRanges returns it) contains r.
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

// ApplyMap makes every shard of m own exactly its ranges under m.Version: first every shard
// revokes, then every shard grants. pools must hold a pool for each shard of m. If any shard
// fails in the revoke phase nothing is granted, so a range is at worst briefly owned by nobody
// (its transfers get a retryable 503), never by two shards. Running it again resumes.
func ApplyMap(ctx context.Context, m *shardmap.Map, pool func(shard string) *pgxpool.Pool) error {
	owned := m.Ownership()
	for _, phase := range []Phase{Revoke, Grant} {
		for _, s := range m.Shards {
			o := Ownership{Shard: s.Name, MapVersion: m.Version, Ranges: owned[s.Name]}
			if err := ApplyOwnership(ctx, pool(s.Name), o, phase); err != nil {
				return fmt.Errorf("shard %s: apply ownership of map version %d: %w", s.Name, m.Version, err)
			}
		}
	}
	return nil
}
