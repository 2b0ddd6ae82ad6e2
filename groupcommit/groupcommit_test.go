package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// echo flushes by answering each item with itself, recording group sizes; a group waits on
// release while release is set, so tests can hold flushers busy.
type echo struct {
	mu      sync.Mutex
	sizes   []int
	release chan struct{}
}

func (e *echo) flush(items []int) []Result[int] {
	e.mu.Lock()
	e.sizes = append(e.sizes, len(items))
	rel := e.release
	e.mu.Unlock()
	if rel != nil {
		<-rel
	}
	out := make([]Result[int], len(items))
	for i, it := range items {
		out[i] = Result[int]{Value: it}
		if it < 0 {
			out[i].Err = errors.New("negative")
		}
	}
	return out
}

// A lone request goes out at once, alone: there is no timer to wait for.
func TestLoneRequestGoesAtOnce(t *testing.T) {
	e := &echo{}
	b := New(Options{MaxBatch: 64, Parallel: 1}, e.flush)
	start := time.Now()
	if v, err := b.Do(context.Background(), 7); v != 7 || err != nil {
		t.Fatalf("Do = %d, %v", v, err)
	}
	if d := time.Since(start); d > time.Second { // no timer on this path: only a stalled machine takes long
		t.Errorf("a lone request took %s", d)
	}
	if len(e.sizes) != 1 || e.sizes[0] != 1 {
		t.Errorf("groups %v, want one of 1", e.sizes)
	}
}

// Requests that arrive while the flusher is busy form groups of at most MaxBatch, each item
// gets its own result (an error stays with its item), and every request is answered.
func TestGroupsFormWhileBusy(t *testing.T) {
	e := &echo{release: make(chan struct{})}
	var observed atomic.Int64
	b := New(Options{MaxBatch: 4, Parallel: 1, Observe: func(n int, waited []time.Duration) {
		if len(waited) == n {
			observed.Add(int64(n))
		}
	}}, e.flush)
	var wg sync.WaitGroup
	first := make(chan struct{})
	wg.Go(func() { // occupies the only flusher
		close(first)
		b.Do(context.Background(), 0) //nolint:errcheck // checked by the sizes
	})
	<-first
	for !func() bool { e.mu.Lock(); defer e.mu.Unlock(); return len(e.sizes) == 1 }() {
		time.Sleep(time.Millisecond)
	}
	results := make([]int, 10)
	errs := make([]error, 10)
	for i := range 10 {
		wg.Go(func() { results[i], errs[i] = b.Do(context.Background(), i-3) })
	}
	for !func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.pending) == 10 }() {
		time.Sleep(time.Millisecond)
	}
	close(e.release)
	wg.Wait()
	if want := []int{1, 4, 4, 2}; !slices.Equal(e.sizes, want) {
		t.Errorf("group sizes %v, want %v", e.sizes, want)
	}
	for i := range 10 {
		if results[i] != i-3 || (errs[i] != nil) != (i-3 < 0) {
			t.Errorf("item %d: %d, %v", i-3, results[i], errs[i])
		}
	}
	if observed.Load() != 11 {
		t.Errorf("observed %d items, want 11", observed.Load())
	}
}

// A request whose context ends while it waits to join a group is withdrawn and never flushed.
func TestWithdrawnBeforeItsGroup(t *testing.T) {
	e := &echo{release: make(chan struct{})}
	b := New(Options{MaxBatch: 8, Parallel: 1}, e.flush)
	go b.Do(context.Background(), 1) //nolint:errcheck // holds the flusher
	for !func() bool { e.mu.Lock(); defer e.mu.Unlock(); return len(e.sizes) == 1 }() {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := b.Do(ctx, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Do after its deadline: %v", err)
	}
	close(e.release)
	if v, err := b.Do(context.Background(), 3); v != 3 || err != nil {
		t.Fatalf("Do = %d, %v", v, err)
	}
	if want := []int{1, 1}; !slices.Equal(e.sizes, want) {
		t.Errorf("groups %v, want %v: the withdrawn item must not be flushed", e.sizes, want)
	}
}

// gated flushes at once, except that a group holding a negative item waits for release; it
// counts the flushes in progress.
type gated struct {
	release  chan struct{}
	inFlight atomic.Int64
	most     atomic.Int64 // the most flushes seen in progress at once
	groups   atomic.Int64
}

func (g *gated) flush(items []int) []Result[int] {
	n := g.inFlight.Add(1)
	defer g.inFlight.Add(-1)
	g.groups.Add(1)
	for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
	}
	out := make([]Result[int], len(items))
	for i, it := range items {
		if it < 0 {
			<-g.release
		}
		out[i].Value = it
	}
	return out
}

// With StallAfter, groups that stay in flight too long (blocked on a lock, say) do not hold up
// the requests queued behind them: a stalled group no longer counts against Parallel, so the next
// goes out beside the stuck ones, and every request that does not depend on them is answered.
func TestStalledGroupsLetTheNextGo(t *testing.T) {
	for _, parallel := range []int{1, 2} {
		t.Run(fmt.Sprintf("parallel %d", parallel), func(t *testing.T) {
			g := &gated{release: make(chan struct{})}
			var stalls atomic.Int64
			b := New(Options{MaxBatch: 8, Parallel: parallel, MaxParallel: 4, StallAfter: 20 * time.Millisecond,
				OnStall: func() { stalls.Add(1) }}, g.flush)
			stuck := make(chan error, parallel)
			// No stall timer starts before this, and a timer never fires early, so no request
			// queued behind the stuck groups can be answered sooner than StallAfter from here.
			began := time.Now()
			for i := range parallel {
				go func() { _, err := b.Do(context.Background(), -1-i); stuck <- err }()
				for g.inFlight.Load() != int64(i+1) {
					time.Sleep(time.Millisecond)
				}
			}
			for i := range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				v, err := b.Do(ctx, i)
				cancel()
				if v != i || err != nil {
					t.Fatalf("Do(%d) beside the stuck groups = %d, %v", i, v, err)
				}
				if d := time.Since(began); i == 0 && d < 20*time.Millisecond {
					t.Errorf("the first request behind the stuck groups was answered %s after they began, before StallAfter", d)
				}
			}
			close(g.release)
			for range parallel {
				if err := <-stuck; err != nil {
					t.Fatalf("a stuck request: %v", err)
				}
			}
			if m := g.most.Load(); m != int64(parallel+1) {
				t.Errorf("at most %d groups in flight, want %d (the stuck ones and one beside them)", m, parallel+1)
			}
			if stalls.Load() == 0 {
				t.Error("OnStall was not called for the stuck groups")
			}
		})
	}
}

// Quick groups keep to Parallel in flight, however many requests wait and however large
// MaxParallel is: the queue forms the next group, up to MaxBatch.
func TestQuickGroupsKeepOneInFlight(t *testing.T) {
	e := &echo{release: make(chan struct{})}
	b := New(Options{MaxBatch: 4, Parallel: 1, MaxParallel: 8, StallAfter: time.Hour}, e.flush)
	go b.Do(context.Background(), 0) //nolint:errcheck // holds the flusher
	for !func() bool { e.mu.Lock(); defer e.mu.Unlock(); return len(e.sizes) == 1 }() {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() { b.Do(context.Background(), i+1) }) //nolint:errcheck // checked by the sizes
	}
	for !func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.pending) == 10 }() {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // a second flusher, if one were allowed, would start here
	close(e.release)
	wg.Wait()
	if want := []int{1, 4, 4, 2}; !slices.Equal(e.sizes, want) {
		t.Errorf("group sizes %v, want %v: one group in flight at a time", e.sizes, want)
	}
}

// After a stall ends, the flushers that were let out beside the stuck ones stop, even while
// requests keep coming, and groups keep to Parallel in flight again; nothing is left running once
// the queue is empty.
func TestFlushersFallBackAfterAStall(t *testing.T) {
	g := &gated{release: make(chan struct{})}
	// StallAfter is long enough that a quick flush below hardly ever takes it, even under -race
	// on a busy machine; if one does, it may rightly let a second group out, so stalls are
	// counted.
	var stalls atomic.Int64
	b := New(Options{MaxBatch: 64, Parallel: 1, MaxParallel: 4, StallAfter: 100 * time.Millisecond,
		OnStall: func() { stalls.Add(1) }}, g.flush)
	var stuck sync.WaitGroup
	for i := range 3 { // three stuck groups: each lets the next go after StallAfter
		stuck.Go(func() { b.Do(context.Background(), -1-i) }) //nolint:errcheck // values unchecked here
		for g.inFlight.Load() != int64(i+1) {
			time.Sleep(time.Millisecond)
		}
	}
	// Steady load, served beside the stuck groups by a fourth flusher, and still coming when
	// they end.
	var load sync.WaitGroup
	var stop atomic.Bool
	for i := range 8 {
		load.Go(func() {
			for !stop.Load() {
				b.Do(context.Background(), i) //nolint:errcheck // values unchecked here
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	close(g.release)
	stuck.Wait()
	time.Sleep(10 * time.Millisecond) // the stuck groups' flushers decide whether to go on
	// Start counting afresh between two groups, so that no group that stalled before is still in
	// flight (a flush that starts after the check below is new, and has not stalled).
	for deadline := time.Now().Add(5 * time.Second); g.inFlight.Load() != 0; time.Sleep(50 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("no moment without a group in flight in 5s")
		}
	}
	g.most.Store(0)
	stalls.Store(0)
	for start := g.groups.Load(); g.groups.Load() < start+200; {
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	load.Wait()
	if m := g.most.Load(); m != 1 && stalls.Load() == 0 {
		t.Errorf("%d groups in flight at once after the stall, with no new stall: want 1", m)
	}
	// A caller's result is delivered before its flusher looks at the queue again, so the last
	// flusher may still be on its way out: give it a moment, not forever.
	counts := func() (running, active int) { b.mu.Lock(); defer b.mu.Unlock(); return b.running, b.active }
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if r, a := counts(); r == 0 && a == 0 {
			return
		}
	}
	r, a := counts()
	t.Errorf("%d flushers running (%d active) 2s after the queue emptied, want none", r, a)
}

// A flusher whose stalled group ends while another flusher is active stops instead of taking the
// queue: the active one takes it when its own group is done, so the queue forms one group.
func TestRecoveredFlusherYieldsTheQueue(t *testing.T) {
	stuck, busy := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	// The busy group must not stall before the check below, some 30 ms after it starts: hence
	// a StallAfter far longer than that, and the test takes about 2 × StallAfter. Should a
	// stalled machine stall it all the same, the stalls say so and the check is void.
	var stalls atomic.Int64
	b := New(Options{MaxBatch: 64, Parallel: 1, MaxParallel: 3, StallAfter: 300 * time.Millisecond,
		OnStall: func() { stalls.Add(1) }},
		func(items []int) []Result[int] {
			mu.Lock()
			sizes = append(sizes, len(items))
			mu.Unlock()
			switch {
			case items[0] < 0:
				<-stuck
			case items[0] >= 100:
				<-busy
			}
			return make([]Result[int], len(items))
		})
	pending := func() int { b.mu.Lock(); defer b.mu.Unlock(); return len(b.pending) }
	flushed := func() int { mu.Lock(); defer mu.Unlock(); return len(sizes) }
	var wg sync.WaitGroup
	var stuckDone sync.WaitGroup
	for i, item := range []int{-1, -2, 100} { // two stalled groups, then one active and busy
		done := &wg
		if item < 0 {
			done = &stuckDone
		}
		done.Go(func() { b.Do(context.Background(), item) }) //nolint:errcheck // values unchecked here
		for flushed() != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	for i := range 5 {
		wg.Go(func() { b.Do(context.Background(), i) }) //nolint:errcheck // values unchecked here
	}
	for pending() != 5 {
		time.Sleep(time.Millisecond)
	}
	close(stuck)
	stuckDone.Wait()
	time.Sleep(20 * time.Millisecond) // time for the recovered flushers to take the queue, were they to
	n := pending()
	busyStalled := stalls.Load() > 2 // read after the queue: a stall before that is counted
	if n != 5 && !busyStalled {
		t.Errorf("%d of 5 queued items left once the stalled groups ended: the recovered flushers took the queue", n)
	}
	close(busy)
	wg.Wait()
	if busyStalled {
		t.Logf("the busy group stalled too (the machine paused for over %s): group sizes %v not checked", 300*time.Millisecond, sizes)
	} else if want := []int{1, 1, 1, 5}; !slices.Equal(sizes, want) {
		t.Errorf("group sizes %v, want %v", sizes, want)
	}
}
