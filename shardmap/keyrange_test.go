package shardmap

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// TestKeyspaceIDGolden pins the routing hash. The values were computed once
// with an independent pure-Python XXH64 (checked against the reference
// vectors XXH64("") = ef46db3751d8e999 and XXH64("abc") = 44bc2cf5ad770999)
// and must never change: a different hash would route existing accounts to
// shards that do not hold their data.
func TestKeyspaceIDGolden(t *testing.T) {
	tests := []struct {
		account int64
		want    uint64
	}{
		{8842, 0x1d65d16c18855fc7}, // the contract value in SPEC.md
		{0, 0x633457081244afec},
		{1, 0xb7b41276360564d4},
		{7, 0x184a52b6a00d7ab7},
		{42, 0x6de6f5d076d742b9},
		{100, 0x554e3148e5066c26},
		{255, 0xd5ce07e01f4f0ec2},
		{1190, 0x7e0ff8d468a22e60},
		{-5, 0xb46b527273306370},
		{123456789, 0x8cb841db40e6ae83},
		{math.MaxInt64, 0xd8afff7b1fb07eb3},
		{math.MinInt64, 0x9e606ab2dd272c10},
	}
	for _, tt := range tests {
		if got := KeyspaceID(tt.account); got != tt.want {
			t.Errorf("KeyspaceID(%d) = %016x, want %016x", tt.account, got, tt.want)
		}
	}
}

func TestParseKeyRange(t *testing.T) {
	const end = uint64(math.MaxUint64)
	tests := []struct {
		in      string
		lo      uint64
		hi      uint64
		bounded bool
		str     string
	}{
		{"-", 0, 0, false, "-"},
		{"-80", 0, 0x8000000000000000, true, "-80"},
		{"80-", 0x8000000000000000, 0, false, "80-"},
		{"80-c0", 0x8000000000000000, 0xc000000000000000, true, "80-c0"},
		{"80-C0", 0x8000000000000000, 0xc000000000000000, true, "80-c0"},
		{"00-80", 0, 0x8000000000000000, true, "-80"},
		{"-8000", 0, 0x8000000000000000, true, "-80"},
		{"4000-4080", 0x4000000000000000, 0x4080000000000000, true, "40-4080"},
		{"0000000000000001-ffffffffffffffff", 1, end, true, "0000000000000001-ffffffffffffffff"},
		{"ff-", 0xff00000000000000, 0, false, "ff-"},
	}
	for _, tt := range tests {
		r, err := ParseKeyRange(tt.in)
		if err != nil {
			t.Errorf("ParseKeyRange(%q): %v", tt.in, err)
			continue
		}
		hi, bounded := r.Hi()
		if r.Lo() != tt.lo || hi != tt.hi || bounded != tt.bounded {
			t.Errorf("ParseKeyRange(%q) = [%x, %x bounded=%v), want [%x, %x bounded=%v)", tt.in, r.Lo(), hi, bounded, tt.lo, tt.hi, tt.bounded)
		}
		if r.String() != tt.str {
			t.Errorf("ParseKeyRange(%q).String() = %q, want %q", tt.in, r.String(), tt.str)
		}
		if back, err := ParseKeyRange(r.String()); err != nil || back != r {
			t.Errorf("round trip of %q: got %v, %v", tt.in, back, err)
		}
	}
}

func TestParseKeyRangeErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", "exactly one '-'"},
		{"80", "exactly one '-'"},
		{"-80-", "exactly one '-'"},
		{"8-c0", `start: "8" has an odd number of hex digits`},
		{"80-c", `end: "c" has an odd number of hex digits`},
		{"zz-", `start: "zz" is not hexadecimal`},
		{"0x-", `start: "0x" is not hexadecimal`},
		{"-+8", `end: "+8" is not hexadecimal`},
		{" -80", "odd number"},
		{"-000000000000000001", "longer than 8 bytes"},
		{"c0-80", "start must be below end"},
		{"80-80", "start must be below end"},
		{"00-00", "start must be below end"},
	}
	for _, tt := range tests {
		_, err := ParseKeyRange(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseKeyRange(%q) error = %v, want it to contain %q", tt.in, err, tt.want)
		}
	}
}

func TestKeyRangeContains(t *testing.T) {
	const half = uint64(0x8000000000000000)
	tests := []struct {
		r    string
		id   uint64
		want bool
	}{
		{"-80", 0, true},
		{"-80", half - 1, true},
		{"-80", half, false},
		{"80-", half, true},
		{"80-", half - 1, false},
		{"80-", math.MaxUint64, true},
		{"80-c0", 0xbfffffffffffffff, true},
		{"80-c0", 0xc000000000000000, false},
		{"-", 0, true},
		{"-", math.MaxUint64, true},
		{"-ffffffffffffffff", math.MaxUint64, false},
		{"-ffffffffffffffff", math.MaxUint64 - 1, true},
	}
	for _, tt := range tests {
		r, err := ParseKeyRange(tt.r)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Contains(tt.id); got != tt.want {
			t.Errorf("%s.Contains(%016x) = %v, want %v", tt.r, tt.id, got, tt.want)
		}
	}
}

func TestKeyRangeZeroValueAndText(t *testing.T) {
	var r KeyRange
	if r.String() != "-" || !r.Contains(0) || !r.Contains(math.MaxUint64) {
		t.Errorf("zero KeyRange is %q, want the whole keyspace", r)
	}
	b, err := json.Marshal([]KeyRange{mustRange(t, "80-c0"), mustRange(t, "c0-")})
	if err != nil || string(b) != `["80-c0","c0-"]` {
		t.Errorf("json.Marshal = %s, %v", b, err)
	}
}

func mustRange(t testing.TB, s string) KeyRange {
	t.Helper()
	r, err := ParseKeyRange(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestKeyRangeIntersect(t *testing.T) {
	tests := []struct{ a, b, want string }{
		{"-", "-", "-"},
		{"-", "40-80", "40-80"},
		{"80-", "40-c0", "80-c0"},
		{"40-", "80-", "80-"},
		{"-80", "40-", "40-80"},
		{"-40", "40-", ""}, // adjacent: nothing shared
		{"-40", "80-c0", ""},
		{"4000-4001", "40-41", "40-4001"}, // 4000 is 40, canonically
	}
	for _, tt := range tests {
		a, _ := ParseKeyRange(tt.a)
		b, _ := ParseKeyRange(tt.b)
		for _, pair := range [][2]KeyRange{{a, b}, {b, a}} {
			got, ok := pair[0].Intersect(pair[1])
			if tt.want == "" {
				if ok {
					t.Errorf("%s ∩ %s = %s, want nothing", pair[0], pair[1], got)
				}
				continue
			}
			if !ok || got.String() != tt.want {
				t.Errorf("%s ∩ %s = %s, %t; want %s", pair[0], pair[1], got, ok, tt.want)
			}
		}
	}
}
