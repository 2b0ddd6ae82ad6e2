package shardmap

import (
	"encoding/hex"
	"fmt"
	"math/bits"
	"strings"
)

// KeyRange is a Vitess-style half-open range [Lo, Hi) of keyspace ids.
//
// It is written as "START-END" where each bound is a big-endian byte prefix
// of 1 to 8 bytes in hex, zero-padded on the right to 8 bytes: "80" is
// 0x8000000000000000. An empty START is 0 and an empty END is the end of the
// keyspace, so "-80" is [0, 0x8000000000000000), "c0-" is
// [0xc000000000000000, 2^64) and "-" is the whole keyspace.
//
// The zero value is the whole keyspace. KeyRange is comparable with ==.
type KeyRange struct {
	start uint64
	end   uint64
	// bounded is false when the range runs to the end of the keyspace; then
	// end is unused. An explicit flag is needed because 2^64 does not fit in
	// a uint64.
	bounded bool
}

// maxBoundBytes is the length of a keyspace id; a longer prefix could not
// be represented.
const maxBoundBytes = 8

// ParseKeyRange parses the Vitess form "START-END" described on [KeyRange].
// Hex digits may be lower- or upper-case.
func ParseKeyRange(s string) (KeyRange, error) {
	if strings.Count(s, "-") != 1 {
		return KeyRange{}, fmt.Errorf("key range %q must contain exactly one '-' between START and END", s)
	}
	lo, hi, _ := strings.Cut(s, "-")
	start, err := parseBound(lo)
	if err != nil {
		return KeyRange{}, fmt.Errorf("key range %q: start: %w", s, err)
	}
	r := KeyRange{start: start}
	if hi == "" {
		return r, nil
	}
	end, err := parseBound(hi)
	if err != nil {
		return KeyRange{}, fmt.Errorf("key range %q: end: %w", s, err)
	}
	if start >= end {
		return KeyRange{}, fmt.Errorf("key range %q: start must be below end", s)
	}
	r.end, r.bounded = end, true
	return r, nil
}

// parseBound turns a hex byte prefix into a keyspace id; "" is 0.
func parseBound(h string) (uint64, error) {
	switch {
	case h == "":
		return 0, nil
	case len(h)%2 != 0:
		return 0, fmt.Errorf("%q has an odd number of hex digits (bounds are whole bytes)", h)
	case len(h) > 2*maxBoundBytes:
		return 0, fmt.Errorf("%q is longer than %d bytes", h, maxBoundBytes)
	}
	b, err := hex.DecodeString(h)
	if err != nil {
		return 0, fmt.Errorf("%q is not hexadecimal: %w", h, err)
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	// A prefix is padded on the right: "80" means 0x8000000000000000.
	return v << (8 * (maxBoundBytes - len(b))), nil
}

// String returns the canonical form: lower-case hex with trailing zero
// bytes dropped, an empty start for 0 and an empty end for the end of the
// keyspace ("80-c0", "-80", "c0-", "-"). ParseKeyRange(r.String()) == r, so
// "00-80", "-8000" and "-80" all print as "-80".
func (r KeyRange) String() string {
	s := formatBound(r.start) + "-"
	if r.bounded {
		s += formatBound(r.end)
	}
	return s
}

// formatBound is the inverse of parseBound for canonical text.
func formatBound(v uint64) string {
	if v == 0 {
		return ""
	}
	h := fmt.Sprintf("%016x", v)
	for strings.HasSuffix(h, "00") {
		h = h[:len(h)-2]
	}
	return h
}

// MarshalText encodes r in its String form, so JSON and logs show "80-c0"
// rather than internal fields.
func (r KeyRange) MarshalText() ([]byte, error) {
	return []byte(r.String()), nil
}

// Contains reports whether id lies in [Lo, Hi).
func (r KeyRange) Contains(id uint64) bool {
	return id >= r.start && (!r.bounded || id < r.end)
}

// Lo returns the inclusive start of the range.
func (r KeyRange) Lo() uint64 { return r.start }

// Hi returns the exclusive end of the range. bounded is false (and end 0)
// when the range runs to the end of the keyspace, whose end 2^64 does not
// fit in a uint64.
func (r KeyRange) Hi() (end uint64, bounded bool) {
	if !r.bounded {
		return 0, false
	}
	return r.end, true
}

// Intersect returns the ids in both r and o, and false when they share none.
func (r KeyRange) Intersect(o KeyRange) (KeyRange, bool) {
	out := KeyRange{start: max(r.start, o.start)}
	switch {
	case !r.bounded:
		out.end, out.bounded = o.end, o.bounded
	case !o.bounded:
		out.end, out.bounded = r.end, true
	default:
		out.end, out.bounded = min(r.end, o.end), true
	}
	if out.bounded && out.start >= out.end {
		return KeyRange{}, false
	}
	return out, true
}

// share is an exact number of keyspace ids. all stands for the whole
// keyspace, 2^64 ids, which n cannot hold. Exactness matters at the edges:
// in float64 a one-id range and the rest of the keyspace would both round
// away.
type share struct {
	n   uint64
	all bool
}

// share returns the number of ids in r.
func (r KeyRange) share() share {
	switch {
	case r.bounded:
		return share{n: r.end - r.start}
	case r.start == 0:
		return share{all: true}
	default:
		return share{n: -r.start} // 2^64 - start, modulo 2^64
	}
}

// plus adds disjoint shares; their sum is at most 2^64, so a carry out of
// n means exactly the whole keyspace.
func (s share) plus(t share) share {
	n, carry := bits.Add64(s.n, t.n, 0)
	return share{n: n, all: s.all || t.all || carry == 1}
}

// fraction returns s as a part of the keyspace, 0..1.
func (s share) fraction() float64 {
	if s.all {
		return 1
	}
	return float64(s.n) / (1 << 64)
}

// String formats s as a percentage of the keyspace with two decimals,
// never rounding a real move to 0% or a partial one to 100%.
func (s share) String() string {
	p := fmt.Sprintf("%.2f%%", s.fraction()*100)
	switch {
	case s.all:
		return "100.00%"
	case s.n > 0 && p == "0.00%":
		return "<0.01%"
	case p == "100.00%":
		return ">99.99%"
	}
	return p
}
