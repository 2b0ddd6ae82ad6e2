package shardmap

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Move is a part of the keyspace whose owner changes.
type Move struct {
	Range    KeyRange
	From, To string
}

// Diff is what replacing one map by another changes. It never holds a DSN.
type Diff struct {
	OldVersion, NewVersion int64
	// Moves lists the sub-ranges that change owner, in keyspace order, with
	// adjacent sub-ranges of the same move merged. Ownership is by shard
	// name, so renaming a shard moves its ranges.
	Moves []Move
	// MovedFraction is the share of the keyspace in Moves, 0..1.
	MovedFraction float64
	// Added, Removed and DSNChanged are shard names, sorted.
	Added, Removed, DSNChanged []string
}

// Compare returns what replacing prev by next changes. Both must come from
// Parse.
func Compare(prev, next *Map) Diff {
	d := Diff{OldVersion: prev.Version, NewVersion: next.Version}
	// Every boundary of either map starts a segment owned by one shard in
	// each map; comparing the owners segment by segment finds every move.
	var bounds []uint64
	for _, m := range []*Map{prev, next} {
		for _, p := range m.index {
			bounds = append(bounds, p.r.start)
		}
	}
	slices.Sort(bounds)
	bounds = slices.Compact(bounds)
	for i, lo := range bounds {
		seg := KeyRange{start: lo}
		if i+1 < len(bounds) {
			seg.end, seg.bounded = bounds[i+1], true
		}
		from, _ := prev.ShardFor(lo)
		to, _ := next.ShardFor(lo)
		if from.Name == to.Name {
			continue
		}
		if n := len(d.Moves); n > 0 {
			last := &d.Moves[n-1]
			if last.From == from.Name && last.To == to.Name && last.Range.bounded && last.Range.end == lo {
				last.Range.end, last.Range.bounded = seg.end, seg.bounded
				continue
			}
		}
		d.Moves = append(d.Moves, Move{Range: seg, From: from.Name, To: to.Name})
	}
	d.MovedFraction = d.moved().fraction()
	for _, s := range next.Shards {
		switch old := prev.Shard(s.Name); {
		case old == nil:
			d.Added = append(d.Added, s.Name)
		case old.DSN != s.DSN:
			d.DSNChanged = append(d.DSNChanged, s.Name)
		}
	}
	for _, s := range prev.Shards {
		if next.Shard(s.Name) == nil {
			d.Removed = append(d.Removed, s.Name)
		}
	}
	sort.Strings(d.Added)
	sort.Strings(d.Removed)
	sort.Strings(d.DSNChanged)
	return d
}

// moved returns the exact number of ids in d.Moves.
func (d Diff) moved() share {
	var total share
	for _, m := range d.Moves {
		total = total.plus(m.Range.share())
	}
	return total
}

// VersionIncreases reports whether the new map may replace the old one:
// a router refuses to go back or to apply a different map under the same
// version.
func (d Diff) VersionIncreases() bool { return d.NewVersion > d.OldVersion }

// maxVerdictMoves bounds the verdict line; the full list is above it.
const maxVerdictMoves = 5

// String returns a report for an operator, one fact per line, ending with
// a one-line verdict such as
//
//	verdict: 25.00% of the keyspace changes owner (80-c0: shard-b -> shard-c); version 7 -> 8
//
// A version that does not increase is flagged in the verdict as a problem.
func (d Diff) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "version: %d -> %d\n", d.OldVersion, d.NewVersion)
	for _, l := range []struct {
		label string
		names []string
	}{
		{"shards added", d.Added},
		{"shards removed", d.Removed},
		{"dsn changed (not shown)", d.DSNChanged},
	} {
		if len(l.names) > 0 {
			fmt.Fprintf(&b, "%s: %s\n", l.label, strings.Join(l.names, ", "))
		}
	}
	if len(d.Moves) == 0 {
		b.WriteString("moves: none\n")
	} else {
		b.WriteString("moves:\n")
		for _, m := range d.Moves {
			fmt.Fprintf(&b, "  %s: %s -> %s (%s of the keyspace)\n", m.Range, m.From, m.To, m.Range.share())
		}
	}
	var verdict []string
	if len(d.Moves) == 0 {
		verdict = append(verdict, "no ownership change")
	} else {
		var moves []string
		for _, m := range d.Moves[:min(len(d.Moves), maxVerdictMoves)] {
			moves = append(moves, fmt.Sprintf("%s: %s -> %s", m.Range, m.From, m.To))
		}
		if extra := len(d.Moves) - maxVerdictMoves; extra > 0 {
			moves = append(moves, fmt.Sprintf("and %d more", extra))
		}
		verdict = append(verdict, fmt.Sprintf("%s of the keyspace changes owner (%s)", d.moved(), strings.Join(moves, ", ")))
	}
	if d.VersionIncreases() {
		verdict = append(verdict, fmt.Sprintf("version %d -> %d", d.OldVersion, d.NewVersion))
	} else {
		verdict = append(verdict, fmt.Sprintf("problem: version does not increase (%d -> %d); set it above %d or routers will refuse the map",
			d.OldVersion, d.NewVersion, d.OldVersion))
	}
	fmt.Fprintf(&b, "verdict: %s", strings.Join(verdict, "; "))
	return b.String()
}
