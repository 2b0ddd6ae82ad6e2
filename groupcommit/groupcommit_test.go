package groupcommit

import (
	"context"
	"errors"
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
	if d := time.Since(start); d > 100*time.Millisecond {
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
