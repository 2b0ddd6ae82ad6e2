// Package partition is the naming scheme of idempotency_record's time partitions: an interval
// (daily or monthly), the partition that holds a given time, and which names and bounds follow
// the scheme. It is pure: upkeep (package idem) creates and drops the tables it names.
package partition

import (
	"fmt"
	"strings"
	"time"
)

// Interval is how much time one idempotency_record partition covers.
type Interval int

// The partition intervals the product supports: partitions idempotency_record_YYYY_MM_DD (daily)
// or idempotency_record_YYYY_MM (monthly).
const (
	Daily Interval = iota + 1
	Monthly
)

// String returns "daily" or "monthly".
func (iv Interval) String() string {
	switch iv {
	case Daily:
		return "daily"
	case Monthly:
		return "monthly"
	}
	return fmt.Sprintf("Interval(%d)", int(iv))
}

// Partition is one idempotency_record partition and the time range [From, To) it holds, in UTC.
type Partition struct {
	Name     string
	From, To time.Time
}

// At returns the partition of interval iv that holds time t.
func At(iv Interval, t time.Time) Partition {
	t = t.UTC()
	switch iv {
	case Monthly:
		from := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
		return Partition{Name: from.Format("idempotency_record_2006_01"), From: from, To: from.AddDate(0, 1, 0)}
	default:
		from := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
		return Partition{Name: from.Format("idempotency_record_2006_01_02"), From: from, To: from.AddDate(0, 0, 1)}
	}
}

// FollowsScheme reports whether p's name and bounds are exactly those At gives for
// some interval: a daily partition named for its day, or a monthly one named for its month.
func FollowsScheme(p Partition) bool {
	for _, iv := range []Interval{Daily, Monthly} {
		if q := At(iv, p.From); q.Name == p.Name && q.From.Equal(p.From) && q.To.Equal(p.To) {
			return true
		}
	}
	return false
}

// ParseName returns the partition a name of our scheme stands for.
func ParseName(name string) (Partition, bool) {
	date, ok := strings.CutPrefix(name, "idempotency_record_")
	if !ok {
		return Partition{}, false
	}
	for _, f := range []struct {
		iv     Interval
		layout string
	}{{Daily, "2006_01_02"}, {Monthly, "2006_01"}} {
		if t, err := time.Parse(f.layout, date); err == nil {
			if p := At(f.iv, t); p.Name == name {
				return p, true
			}
		}
	}
	return Partition{}, false
}

// Longest is the most time one partition of interval iv covers.
func (iv Interval) Longest() time.Duration {
	if iv == Monthly {
		return 31 * 24 * time.Hour
	}
	return 24 * time.Hour
}
