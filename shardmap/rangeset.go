package shardmap

import (
	"slices"
	"sort"
)

// SortRanges sorts rs by start, in place, and returns it.
func SortRanges(rs []KeyRange) []KeyRange {
	sort.Slice(rs, func(i, j int) bool { return rs[i].Lo() < rs[j].Lo() })
	return rs
}

// Covers reports whether the union of set (sorted by Lo) contains r.
func Covers(set []KeyRange, r KeyRange) bool {
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

// CoversAll reports whether every range of rs lies in the union of set (sorted by Lo).
func CoversAll(set, rs []KeyRange) bool {
	for _, r := range rs {
		if !Covers(set, r) {
			return false
		}
	}
	return true
}

// SameRanges reports whether a and b hold the same ranges, in any order.
func SameRanges(a, b []KeyRange) bool {
	if len(a) != len(b) {
		return false
	}
	for _, r := range a {
		if !slices.Contains(b, r) {
			return false
		}
	}
	return true
}
