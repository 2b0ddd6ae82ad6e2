package config

import (
	"fmt"
	"math"
)

// RangeMoves tunes the background work of range moves: the bulk copy and catch-up of
// `router shardmap apply` (and of `router migrate`), and the purge of moved rows that apply and
// `router serve` run on a range's old owner.
type RangeMoves struct {
	// Pace is the ratio of pause to work: after each batch that took d, the work pauses Pace×d,
	// so it takes at least (1+Pace) times as long and leaves the shards' CPU to transfers for the rest.
	// 0 does not pause. The fence (the last catch-up and the grant) never pauses.
	Pace float64
}

// maxPace bounds range_moves.pace (idem.MaxPace): a pause ten times each batch.
const maxPace = 10

// rangeMovesFile is the range_moves section as router.yaml spells it.
type rangeMovesFile struct {
	Pace *float64 `yaml:"pace"`
}

// withDefaults: a pace of 1 left a 2-core machine about half idle during the copy, and kept a move of
// 1,000,000 transfers at about 5 minutes (docs/operations.md);
// rangemove.DefaultPace is the same.
func (f rangeMovesFile) withDefaults() RangeMoves {
	return RangeMoves{Pace: deref(f.Pace, 1)}
}

func (r RangeMoves) validate() []string {
	if err := CheckPace(r.Pace); err != nil {
		return []string{"range_moves." + err.Error()}
	}
	return nil
}

// CheckPace reports what is wrong with a range-move pace (range_moves.pace, apply --pace): it
// must be a number from 0 (no pause) to 10.
func CheckPace(pace float64) error {
	if math.IsNaN(pace) || pace < 0 || pace > maxPace {
		return fmt.Errorf("pace: %v must be between 0 (no pause) and %d (a pause ten times as long as each batch)", pace, maxPace)
	}
	return nil
}
