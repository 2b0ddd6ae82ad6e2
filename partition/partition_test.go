package partition

import (
	"testing"
	"time"
)

func TestPartitionScheme(t *testing.T) {
	day := time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name   string
		want   Partition
		parsed bool
	}{
		{"idempotency_record_2026_02_28", Partition{Name: "idempotency_record_2026_02_28", From: day, To: day.AddDate(0, 0, 1)}, true},
		{"idempotency_record_2026_02", Partition{Name: "idempotency_record_2026_02", From: day.AddDate(0, 0, -27), To: day.AddDate(0, 0, 1)}, true},
		{"idempotency_record_2026_2_28", Partition{}, false},
		{"idempotency_record_2026_02_30", Partition{}, false},
		{"idempotency_record_2026_13", Partition{}, false},
		{"idempotency_record_archive", Partition{}, false},
		{"other_2026_02_28", Partition{}, false},
	} {
		p, ok := ParseName(tc.name)
		if ok != tc.parsed || p.Name != tc.want.Name || !p.From.Equal(tc.want.From) || !p.To.Equal(tc.want.To) {
			t.Errorf("ParseName(%q) = %+v, %t; want %+v, %t", tc.name, p, ok, tc.want, tc.parsed)
		}
		if ok && !FollowsScheme(p) {
			t.Errorf("FollowsScheme(%+v) = false", p)
		}
	}
	if FollowsScheme(Partition{Name: "idempotency_record_2026_02_28", From: day, To: day.AddDate(0, 0, 2)}) {
		t.Error("a two-day range named for one day follows the scheme")
	}
}
