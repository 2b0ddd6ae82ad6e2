package shardmap

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

// mapOf builds a map from "name=range,range" specs; the DSN of each shard
// is host=NAME unless the spec carries "@dsn".
func mapOf(t *testing.T, version int, specs ...string) *Map {
	t.Helper()
	lines := []string{fmt.Sprintf("version: %d", version), "shards:"}
	for _, s := range specs {
		name, ranges, _ := strings.Cut(s, "=")
		ranges, dsn, found := strings.Cut(ranges, "@")
		if !found {
			dsn = "host=" + name
		}
		lines = append(lines, fmt.Sprintf("  - {name: %s, dsn: %q, ranges: [%s]}", name, dsn, ranges))
	}
	return mustParse(t, lines...)
}

func TestCompare(t *testing.T) {
	tests := []struct {
		name     string
		old, new *Map
		moves    []string
		fraction float64
		added    []string
		removed  []string
		dsn      []string
	}{
		{
			name: "identical",
			old:  mapOf(t, 7, "shard-a=-80", "shard-b=80-c0,c0-"),
			new:  mapOf(t, 8, "shard-a=-80", "shard-b=80-"),
		},
		{
			name:     "split to a new shard",
			old:      mapOf(t, 7, "shard-a=-80", "shard-b=80-c0,c0-"),
			new:      mapOf(t, 8, "shard-a=-80", "shard-b=c0-", "shard-c=80-c0"),
			moves:    []string{"80-c0: shard-b -> shard-c"},
			fraction: 0.25,
			added:    []string{"shard-c"},
		},
		{
			name:     "merge away a shard, adjacent moves coalesce",
			old:      mapOf(t, 7, "shard-a=-40", "shard-b=40-60,60-80", "shard-c=80-"),
			new:      mapOf(t, 8, "shard-a=-80", "shard-c=80-"),
			moves:    []string{"40-80: shard-b -> shard-a"},
			fraction: 0.25,
			removed:  []string{"shard-b"},
		},
		{
			name:     "boundaries that differ on both sides",
			old:      mapOf(t, 1, "a=-80", "b=80-"),
			new:      mapOf(t, 2, "a=-40,c0-", "b=40-c0"),
			moves:    []string{"40-80: a -> b", "c0-: b -> a"},
			fraction: 0.5,
		},
		{
			name:     "whole keyspace",
			old:      mapOf(t, 1, "a=-80,80-"),
			new:      mapOf(t, 2, "b=-"),
			moves:    []string{"-: a -> b"},
			fraction: 1,
			added:    []string{"b"},
			removed:  []string{"a"},
		},
		{
			name:     "renamed shard, dsn change",
			old:      mapOf(t, 3, "old=-80", "keep=80-@host=k1"),
			new:      mapOf(t, 4, "new=-80", "keep=80-@host=k2"),
			moves:    []string{"-80: old -> new"},
			fraction: 0.5,
			added:    []string{"new"},
			removed:  []string{"old"},
			dsn:      []string{"keep"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Compare(tt.old, tt.new)
			var moves []string
			for _, m := range d.Moves {
				moves = append(moves, fmt.Sprintf("%s: %s -> %s", m.Range, m.From, m.To))
			}
			if !reflect.DeepEqual(moves, tt.moves) {
				t.Errorf("moves = %q, want %q", moves, tt.moves)
			}
			if math.Abs(d.MovedFraction-tt.fraction) > 1e-12 {
				t.Errorf("MovedFraction = %v, want %v", d.MovedFraction, tt.fraction)
			}
			if !reflect.DeepEqual(d.Added, tt.added) || !reflect.DeepEqual(d.Removed, tt.removed) || !reflect.DeepEqual(d.DSNChanged, tt.dsn) {
				t.Errorf("added %v removed %v dsn %v, want %v %v %v", d.Added, d.Removed, d.DSNChanged, tt.added, tt.removed, tt.dsn)
			}
		})
	}
}

func TestDiffString(t *testing.T) {
	old := mapOf(t, 7, "shard-a=-80", "shard-b=80-c0,c0-@postgres://u:hunter2@b/db")
	next := mapOf(t, 8, "shard-a=-80", "shard-b=c0-@postgres://u:hunter3@b/db", "shard-c=80-c0")
	got := Compare(old, next).String()
	want := `version: 7 -> 8
shards added: shard-c
dsn changed (not shown): shard-b
moves:
  80-c0: shard-b -> shard-c (25.00% of the keyspace)
verdict: 25.00% of the keyspace changes owner (80-c0: shard-b -> shard-c); version 7 -> 8`
	if got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}

	tests := []struct {
		name    string
		d       Diff
		verdict string
	}{
		{"no change", Compare(old, mapOf(t, 8, "shard-a=-80", "shard-b=80-")),
			"verdict: no ownership change; version 7 -> 8"},
		{"same version", Compare(old, old),
			"verdict: no ownership change; problem: version does not increase (7 -> 7); set it above 7 or routers will refuse the map"},
		{"going back", Compare(next, old),
			"verdict: 25.00% of the keyspace changes owner (80-c0: shard-c -> shard-b); problem: version does not increase (8 -> 7)"},
		{"everything", Compare(mapOf(t, 1, "a=-"), mapOf(t, 2, "b=-")),
			"verdict: 100.00% of the keyspace changes owner (-: a -> b); version 1 -> 2"},
		{"many moves", Compare(
			mapOf(t, 1, "a=-10,20-30,40-50,60-70,80-90,a0-b0", "b=10-20,30-40,50-60,70-80,90-a0,b0-"),
			mapOf(t, 2, "b=-10,20-30,40-50,60-70,80-90,a0-b0", "a=10-20,30-40,50-60,70-80,90-a0,b0-")),
			"(-10: a -> b, 10-20: b -> a, 20-30: a -> b, 30-40: b -> a, 40-50: a -> b, and 7 more); version 1 -> 2"},
		{"tiny move", Compare(mapOf(t, 1, "a=-ffffffffffffffff", "b=ffffffffffffffff-"), mapOf(t, 2, "a=-")),
			"verdict: <0.01% of the keyspace changes owner (ffffffffffffffff-: b -> a); version 1 -> 2"},
		{"almost everything", Compare(mapOf(t, 1, "a=-ffffffffffffffff", "b=ffffffffffffffff-"), mapOf(t, 2, "b=-")),
			"verdict: >99.99% of the keyspace changes owner (-ffffffffffffffff: a -> b); version 1 -> 2"},
	}
	for _, tt := range tests {
		s := tt.d.String()
		last := s[strings.LastIndexByte(s, '\n')+1:]
		if !strings.HasPrefix(last, "verdict: ") || !strings.Contains(last, tt.verdict) {
			t.Errorf("%s: last line %q, want it to contain %q", tt.name, last, tt.verdict)
		}
		if strings.Contains(s, "hunter") {
			t.Errorf("%s: report leaks a DSN:\n%s", tt.name, s)
		}
	}
	if d := Compare(old, old); d.VersionIncreases() {
		t.Error("VersionIncreases() is true for equal versions")
	}
}
