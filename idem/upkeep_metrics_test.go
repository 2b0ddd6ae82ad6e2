package idem

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/partition"
)

// gather returns every sample of c as name → shard → value.
func gather(t *testing.T, c prometheus.Collector) map[string]map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]float64{}
	for _, f := range families {
		out[f.GetName()] = map[string]float64{}
		for _, m := range f.GetMetric() {
			shard := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "shard" {
					shard = l.GetValue()
				}
			}
			out[f.GetName()][shard] = m.GetGauge().GetValue()
		}
	}
	return out
}

func TestUpkeepCollector(t *testing.T) {
	now := time.Date(2026, 3, 15, 12, 0, 0, 0, time.UTC)
	c := NewUpkeepCollector(partition.Daily, month)
	c.now = func() time.Time { return now }
	// Every lookup still reads the partitions beginning before today: the old one and today's.
	state := PartitionState{ReadAt: now, Rows: 1200, Bytes: 65536, UncheckedBefore: now}
	for _, at := range []time.Time{now.Add(-31 * 24 * time.Hour), now, now.Add(24 * time.Hour), now.Add(48 * time.Hour)} {
		state.Partitions = append(state.Partitions, partition.At(partition.Daily, at))
	}
	c.Record("shard-a", UpkeepReport{State: state}, nil)
	c.Record("shard-b", UpkeepReport{}, errors.New("connection refused"))
	lastA := float64(now.Unix())

	now = now.Add(time.Hour)
	c.Record("shard-a", UpkeepReport{Skipped: true}, nil) // another router did it: no news
	got := gather(t, c)
	want := map[string]map[string]float64{
		"shardgate_upkeep_last_success_timestamp_seconds":    {"shard-a": lastA, "shard-b": 0},
		"shardgate_idempotency_future_partitions":            {"shard-a": 2},
		"shardgate_idempotency_oldest_partition_age_seconds": {"shard-a": (31*24 + 13) * 3600},
		"shardgate_idempotency_rows":                         {"shard-a": 1200},
		"shardgate_idempotency_bytes":                        {"shard-a": 65536},
		"shardgate_idempotency_unchecked_partitions":         {"shard-a": 2},
		"shardgate_idempotency_retention_seconds":            {"": month.Seconds()},
		"shardgate_idempotency_partition_interval_seconds":   {"": 86400},
	}
	for name, series := range want {
		for shard, v := range series {
			if g, ok := got[name][shard]; !ok || g != v {
				t.Errorf("%s{shard=%q} = %v (present %t), want %v", name, shard, g, ok, v)
			}
		}
		if len(got[name]) != len(series) {
			t.Errorf("%s has series %v, want %v", name, got[name], series)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d metric families, want %d", len(got), len(want))
	}

	// Before migration 0006 every lookup reads every partition.
	state.UncheckedBefore = time.Time{}
	c.Record("shard-a", UpkeepReport{State: state}, nil)
	if got := gather(t, c)["shardgate_idempotency_unchecked_partitions"]["shard-a"]; got != 4 {
		t.Errorf("unchecked partitions before migration 0006: %v, want all 4", got)
	}

	c.Retain([]string{"shard-a"})
	if _, ok := gather(t, c)["shardgate_upkeep_last_success_timestamp_seconds"]["shard-b"]; ok {
		t.Error("shard-b is still reported after it left the map")
	}
	var none *UpkeepCollector
	none.Record("shard-a", UpkeepReport{}, nil) // callers without metrics pass nil
	none.Retain(nil)
}
