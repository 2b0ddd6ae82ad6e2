package idem

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// A pace is a number from 0 to MaxPace; anything else is refused in words that name it.
func TestCheckPace(t *testing.T) {
	for _, ok := range []float64{0, 0.25, 1, MaxPace} {
		if err := CheckPace(ok); err != nil {
			t.Errorf("CheckPace(%v): %v", ok, err)
		}
	}
	for _, bad := range []float64{-0.5, MaxPace + 0.1, math.NaN(), math.Inf(1)} {
		if err := CheckPace(bad); err == nil || !strings.Contains(err.Error(), "must be between 0 (no pause) and 10") {
			t.Errorf("CheckPace(%v) = %v, want an error naming the bounds", bad, err)
		}
	}
}

// Nap pauses pace times as long as the batch took, not at all at pace 0, and no longer than
// its context lasts.
func TestNapPace(t *testing.T) {
	ctx := context.Background()
	began := time.Now().Add(-40 * time.Millisecond) // a batch of 40ms
	start := time.Now()
	if err := Nap(ctx, 0, began); err != nil || time.Since(start) > 10*time.Millisecond {
		t.Errorf("pace 0 paused %v (%v), want no pause", time.Since(start), err)
	}
	start = time.Now()
	if err := Nap(ctx, 1.5, began); err != nil || time.Since(start) < 60*time.Millisecond {
		t.Errorf("pace 1.5 after a batch of 40ms paused %v (%v), want at least 60ms", time.Since(start), err)
	}
	stop, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	start = time.Now()
	if err := Nap(stop, 10, time.Now().Add(-time.Second)); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Errorf("a pause of 10s cut by a context of 20ms: %v after %v, want the context's error at once", err, time.Since(start))
	}
}
