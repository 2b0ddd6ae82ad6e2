// Package groupcommit sends concurrent requests bound for one destination together, as one
// group, to amortize what each would pay alone (for shardgate, a shard's commit). No request
// waits for a timer to form a group: a request that finds no flusher at work goes out at once,
// alone if it is alone, so a lone request at low load waits for nothing. Groups form only from
// requests that arrive while Parallel groups are in flight, up to a cap. With StallAfter set, a
// timer watches each group in flight, and one that stalls (in flight longer than StallAfter)
// lets the next go beside it, so a stuck group does not hold up the rest. The caller's flush
// decides, per item, what the group's failure means.
package groupcommit

import (
	"context"
	"sync"
	"time"
)

// Result is one item's answer from a flush.
type Result[R any] struct {
	Value R
	Err   error
}

// Options bound a Batcher.
type Options struct {
	MaxBatch int // items in one group at most (at least 1)
	Parallel int // groups in flight at once while none has stalled (at least 1)
	// StallAfter, if positive, is how long a group may be in flight before it counts as stalled
	// (say, blocked on a lock). A stalled group does not count against Parallel, so the next
	// group can go beside it, up to MaxParallel groups in flight in all.
	StallAfter  time.Duration
	MaxParallel int // groups in flight at most, stalled ones included (at least Parallel)
	// OnStall, if set, is called each time a flush passes StallAfter.
	OnStall func()
	// Observe, if set, is called for every group before its flush, with its size and how long
	// each item waited to join it. It must be quick: it runs on the flush path.
	Observe func(size int, waited []time.Duration)
}

// Batcher groups items for flush. It is safe for concurrent use; its zero value is not usable.
type Batcher[Q, R any] struct {
	flush func([]Q) []Result[R]
	opts  Options

	mu      sync.Mutex
	pending []*call[Q, R]
	running int // flushers at work
	active  int // of them, those not stalled (in a flush for longer than StallAfter)
}

// flushing is one flusher's current flush, as its stall timer sees it.
type flushing struct {
	done    bool
	stalled bool
}

type call[Q, R any] struct {
	item   Q
	queued time.Time
	taken  bool // in a group: its outcome is now the flush's to decide
	res    Result[R]
	done   chan struct{}
}

// New returns a Batcher that hands groups of items to flush, which must return one Result per
// item, in order.
func New[Q, R any](opts Options, flush func([]Q) []Result[R]) *Batcher[Q, R] {
	opts.MaxBatch = max(opts.MaxBatch, 1)
	opts.Parallel = max(opts.Parallel, 1)
	opts.MaxParallel = max(opts.MaxParallel, opts.Parallel)
	return &Batcher[Q, R]{flush: flush, opts: opts}
}

// Do queues item and returns its result. ctx bounds only the wait to join a group: an item not
// yet taken is withdrawn and Do returns ctx's error, but once its group is being flushed, Do
// waits for that flush (which bounds its own time), since the item's outcome is then decided.
func (b *Batcher[Q, R]) Do(ctx context.Context, item Q) (R, error) {
	c := &call[Q, R]{item: item, queued: time.Now(), done: make(chan struct{})}
	b.mu.Lock()
	b.pending = append(b.pending, c)
	start := b.mayStart()
	b.mu.Unlock()
	if start {
		go b.run()
	}
	select {
	case <-c.done:
		return c.res.Value, c.res.Err
	case <-ctx.Done():
	}
	b.mu.Lock()
	if !c.taken {
		b.withdraw(c)
		b.mu.Unlock()
		var zero R
		return zero, ctx.Err()
	}
	b.mu.Unlock()
	<-c.done
	return c.res.Value, c.res.Err
}

// mayStart reports whether a new flusher may start, and counts it as started if so; b.mu is
// held.
func (b *Batcher[Q, R]) mayStart() bool {
	if b.running >= b.opts.MaxParallel || b.active >= b.opts.Parallel {
		return false
	}
	b.running++
	b.active++
	return true
}

// withdraw removes c from the queue; b.mu is held.
func (b *Batcher[Q, R]) withdraw(c *call[Q, R]) {
	for i, p := range b.pending {
		if p == c {
			b.pending = append(b.pending[:i], b.pending[i+1:]...)
			return
		}
	}
}

// run flushes groups until the queue is empty.
func (b *Batcher[Q, R]) run() {
	for {
		group := b.next()
		if group == nil {
			return
		}
		items := make([]Q, len(group))
		for i, c := range group {
			items[i] = c.item
		}
		if b.opts.Observe != nil {
			now := time.Now()
			waited := make([]time.Duration, len(group))
			for i, c := range group {
				waited[i] = now.Sub(c.queued)
			}
			b.opts.Observe(len(group), waited)
		}
		results := b.flushWatched(items)
		for i, c := range group {
			c.res = results[i]
			close(c.done)
		}
	}
}

// flushWatched flushes items; with StallAfter set, a flush that takes longer counts as stalled
// until it returns, and lets another flusher start for the items queued behind it.
func (b *Batcher[Q, R]) flushWatched(items []Q) []Result[R] {
	if b.opts.StallAfter <= 0 {
		return b.flush(items)
	}
	f := &flushing{}
	t := time.AfterFunc(b.opts.StallAfter, func() { b.stall(f) })
	results := b.flush(items)
	t.Stop()
	b.mu.Lock()
	f.done = true
	if f.stalled {
		b.active++
	}
	b.mu.Unlock()
	return results
}

// stall marks f stalled and starts a flusher for the queue if one may start.
func (b *Batcher[Q, R]) stall(f *flushing) {
	b.mu.Lock()
	if f.done {
		b.mu.Unlock()
		return
	}
	f.stalled = true
	b.active--
	start := len(b.pending) > 0 && b.mayStart()
	b.mu.Unlock()
	if b.opts.OnStall != nil {
		b.opts.OnStall()
	}
	if start {
		go b.run()
	}
}

// next takes the oldest items, up to MaxBatch, as the next group; nil when there are none, and
// then this flusher stops.
func (b *Batcher[Q, R]) next() []*call[Q, R] {
	b.mu.Lock()
	defer b.mu.Unlock()
	// Stop when the queue is empty, and also when more than Parallel flushers are active (after a
	// stall): the others take the queue, so the groups grow back to their size.
	if len(b.pending) == 0 || b.active > b.opts.Parallel {
		b.running--
		b.active--
		return nil
	}
	n := min(len(b.pending), b.opts.MaxBatch)
	group := make([]*call[Q, R], n)
	copy(group, b.pending)
	for _, c := range group {
		c.taken = true
	}
	// Copy the rest down rather than reslicing, so the queue's array does not grow forever.
	rest := copy(b.pending, b.pending[n:])
	clear(b.pending[rest:])
	b.pending = b.pending[:rest]
	return group
}
