package router

import (
	"testing"
	"time"
)

func TestKeyTime(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want time.Time // zero: not a UUIDv7
	}{
		// made by github.com/google/uuid NewV7
		{"01a236f6-33e4-7b8e-9152-390df24f32b1", time.UnixMilli(1796218434532)},
		{"01a236f6-33e6-7639-bbc4-5a2759e4d8ad", time.UnixMilli(1796218434534)},
		// RFC 9562 appendix A.6, upper case as printed there
		{"017F22E2-79B0-7CC3-98C4-DC0C0C07398F", time.Date(2022, 2, 22, 19, 22, 22, 0, time.UTC)},
		{"00000000-0000-7000-8000-000000000000", time.Unix(0, 0)},
		{"ffffffff-ffff-7fff-bfff-ffffffffffff", time.UnixMilli(1<<48 - 1)},

		{"9d3e9812-b9a9-46b4-a461-56abb2bc81d6", time.Time{}},   // version 4
		{"01a236f6-33e4-6b8e-9152-390df24f32b1", time.Time{}},   // version 6
		{"01a236f6-33e4-7b8e-c152-390df24f32b1", time.Time{}},   // variant 110 (Microsoft)
		{"01a236f6-33e4-7b8e-7152-390df24f32b1", time.Time{}},   // variant 0 (NCS)
		{"01a236f633e47b8e9152390df24f32b1", time.Time{}},       // no hyphens
		{"{01a236f6-33e4-7b8e-9152-390df24f32b1}", time.Time{}}, // braces
		{"urn:uuid:01a236f6-33e4-7b8e-9152-390df24f32b1", time.Time{}},
		{`"01a236f6-33e4-7b8e-9152-390df24f32b1"`, time.Time{}}, // still quoted
		{"01a236f6-33e4-7b8e-9152-390df24f32b1\n", time.Time{}},
		{"01a236g6-33e4-7b8e-9152-390df24f32b1", time.Time{}}, // not hex
		{"01a236f-633e4-7b8e-9152-390df24f32b1", time.Time{}}, // hyphen misplaced
		{"01a236f6-33e4-7b8e-9152+390df24f32b1", time.Time{}},
		{"00000000-0000-0000-0000-000000000000", time.Time{}}, // nil UUID
		{"ffffffff-ffff-ffff-ffff-ffffffffffff", time.Time{}}, // max UUID
		{"01ARZ3NDEKTSV4RRFFQ69G5FAV", time.Time{}},           // ULID
		{"", time.Time{}},
	} {
		got, ok := keyTime(tc.key)
		if ok != !tc.want.IsZero() || !got.Equal(tc.want) {
			t.Errorf("keyTime(%q) = %v, %t; want %v, %t", tc.key, got, ok, tc.want, !tc.want.IsZero())
		}
		if ok && got.Location() != time.UTC {
			t.Errorf("keyTime(%q) is in %v, want UTC", tc.key, got.Location())
		}
	}
}
