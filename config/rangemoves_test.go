package config

import (
	"strings"
	"testing"
)

// range_moves.pace is 1 unless set; 0 (no pause) to 10 are accepted, and anything else is
// refused in words naming the key and its bounds.
func TestRangeMovesPace(t *testing.T) {
	c, err := Parse("router.yaml", []byte(validYAML))
	if err != nil || c.RangeMoves.Pace != 1 {
		t.Fatalf("default range_moves.pace %v (%v), want 1", c.RangeMoves.Pace, err)
	}
	for yaml, want := range map[string]float64{"0": 0, "0.5": 0.5, "3": 3, "10": 10} {
		c, err := Parse("router.yaml", []byte(validYAML+"range_moves:\n  pace: "+yaml+"\n"))
		if err != nil || c.RangeMoves.Pace != want {
			t.Errorf("pace %s: %v (%v), want %v", yaml, c.RangeMoves.Pace, err, want)
		}
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"negative", "range_moves:\n  pace: -1\n", "range_moves.pace: -1 must be between 0 (no pause) and 10"},
		{"too slow", "range_moves:\n  pace: 10.5\n", "range_moves.pace: 10.5 must be between 0 (no pause) and 10"},
		{"not a number", "range_moves:\n  pace: .nan\n", "range_moves.pace: NaN must be between 0 (no pause) and 10"},
		{"text", "range_moves:\n  pace: gentle\n", `range_moves.pace: "gentle" is not a number`},
		{"unknown key", "range_moves:\n  nice_ratio: 1\n", "range_moves.nice_ratio is not a setting (range_moves takes pace)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("router.yaml", []byte(validYAML+tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
