package shardmap

import (
	"bytes"
	"errors"
	"math"
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics, that every failure is a
// *ValidationError that does not leak a DSN from the environment, and that
// every map it accepts covers the keyspace exactly once. Seeds are in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add(doc("version: 7", "shards:", "  - {name: a, dsn: ${SHARD_B_DSN}, ranges: [-80]}", "  - {name: b, dsn: host=h, ranges: [80-]}"))
	lookup := env("SHARD_B_DSN", "postgres://u:s3cr3t@h/db", "PW", "s3cr3t")
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse("fuzz.yaml", data, lookup)
		if err != nil {
			var verr *ValidationError
			if !errors.As(err, &verr) || len(verr.Problems) == 0 || m != nil {
				t.Fatalf("Parse = %v, %v; want a nil map and a non-empty *ValidationError", m, err)
			}
			if !bytes.Contains(data, []byte("s3cr3t")) && strings.Contains(err.Error(), "s3cr3t") {
				t.Fatalf("error leaks a secret:\n%v", err)
			}
			return
		}
		checkExactCover(t, m)
	})
}

// checkExactCover verifies the invariants ShardFor relies on.
func checkExactCover(t *testing.T, m *Map) {
	t.Helper()
	if m.Version < 1 || len(m.Shards) == 0 {
		t.Fatalf("accepted version %d with %d shards", m.Version, len(m.Shards))
	}
	n := 0
	for _, s := range m.Shards {
		n += len(s.Ranges)
		for _, r := range s.Ranges {
			if back, err := ParseKeyRange(r.String()); err != nil || back != r {
				t.Fatalf("range %v does not round-trip: %v %v", r, back, err)
			}
		}
	}
	if n != len(m.index) {
		t.Fatalf("index has %d ranges, shards list %d", len(m.index), n)
	}
	var next uint64 // the id the next range must start at
	for i, p := range m.index {
		if p.r.start != next {
			t.Fatalf("range %d (%v) starts at %x, want %x", i, p.r, p.r.start, next)
		}
		last := i == len(m.index)-1
		if end, bounded := p.r.Hi(); bounded == last {
			t.Fatalf("range %d (%v): bounded=%v but last=%v", i, p.r, bounded, last)
		} else {
			next = end
		}
		for _, id := range []uint64{p.r.start, next - 1} {
			if s, r := m.ShardFor(id); r != p.r || s != &m.Shards[p.shard] {
				t.Fatalf("ShardFor(%x) = %s %v, want %v", id, s.Name, r, p.r)
			}
		}
	}
	if _, r := m.ShardFor(math.MaxUint64); !r.Contains(math.MaxUint64) {
		t.Fatalf("ShardFor(max) = %v", r)
	}
	if d := Compare(m, m); len(d.Moves) != 0 || d.MovedFraction != 0 {
		t.Fatalf("a map differs from itself: %v", d)
	}
}
