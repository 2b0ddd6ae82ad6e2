package idem

import (
	"context"
	"fmt"
	"math"
	"time"
)

// MaxPace is the largest pace background work accepts: a pause ten times as long as each
// batch, a tenth of the unpaced speed.
const MaxPace = 10

// CheckPace reports what is wrong with pace, the ratio of pause to work of background work
// (range copies, catch-up passes, purges): it must be a number from 0 (no pause) to MaxPace.
func CheckPace(pace float64) error {
	if math.IsNaN(pace) || pace < 0 || pace > MaxPace {
		return fmt.Errorf("pace %v: must be between 0 (no pause) and %d (a pause %d times as long as each batch)", pace, MaxPace, MaxPace)
	}
	return nil
}

// Nap paces background work, in the spirit of gh-ost's --nice-ratio: after a batch that began
// at began, it sleeps pace times as long as the batch took, so the work takes at least (1+pace) times
// as long and leaves the shard's CPU and I/O to transfers for the rest. It returns early, with
// ctx's error, when ctx ends; with a pace of 0 it returns at once.
func Nap(ctx context.Context, pace float64, began time.Time) error {
	if pace <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(time.Duration(pace * float64(time.Since(began))))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
