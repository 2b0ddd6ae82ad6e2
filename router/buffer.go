package router

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// While a key range moves, its old owner refuses it from the revoke on, and its new owner until
// the grant: the fence. A router holds the requests for a fenced range instead of answering 503
// at once, and sends them on as soon as a shard takes the range. Per fenced range one held
// request at a time probes (sends itself again, after a short wait that grows to
// maxProbeWait); the others wait for the probe to get past the refusal, or for the router's
// map to change, and then all go at once. A router whose map is not older than the refusing
// shard's reads its map file again (at most every mapCheckEvery): the refusal is how a router
// still on the old map learns of the move, and the reload is how it finds the new owner.
//
// A refused attempt writes nothing on the shard (the ownership check comes before the key is
// claimed), so a held request is claimed only on the owner that takes it, and a retry of it
// replays from there as any other.
const (
	firstProbeWait = 5 * time.Millisecond
	maxProbeWait   = 50 * time.Millisecond
	mapCheckEvery  = 100 * time.Millisecond
)

// Outcome labels of shardgate_buffered_requests_total.
const (
	bufSent     = "sent"     // sent on to the range's owner once it took the range; answered by it
	bufTimeout  = "timeout"  // held buffering.max_wait (or to the request's deadline): 503
	bufOverflow = "overflow" // buffering.max_requests were held already: 503 at once, not held
	bufCanceled = "canceled" // the client went away while held; nothing was applied
)

// bufferMetrics are the buffer's series, kept with the router's others.
type bufferMetrics struct {
	held     prometheus.Gauge
	outcomes *prometheus.CounterVec
	wait     prometheus.Histogram
}

func newBufferMetrics(reg prometheus.Registerer) bufferMetrics {
	m := bufferMetrics{
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "shardgate_buffered_requests",
			Help: "POST /transfers requests held now because their key range is moving (its owner refuses it until the new owner takes it).",
		}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shardgate_buffered_requests_total",
			Help: "Requests for a moving key range by how their holding ended: sent (to the new owner), timeout and overflow (answered 503 shard-map-changing), canceled (the client went away).",
		}, []string{"outcome"}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "shardgate_buffered_wait_seconds",
			Help:    "Time a request for a moving key range was held before it was sent on or answered.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
	}
	for _, o := range []string{bufSent, bufTimeout, bufOverflow, bufCanceled} {
		m.outcomes.WithLabelValues(o)
	}
	reg.MustRegister(m.held, m.outcomes, m.wait)
	return m
}

// rangeBuffer holds the requests of fenced key ranges. nil when buffering is off.
type rangeBuffer struct {
	maxWait   time.Duration
	maxHeld   int64
	held      atomic.Int64 // requests held now, of every range
	nfences   atomic.Int64 // len(fences), read without the lock on every request
	lastCheck atomic.Int64 // when a held request last read the map file, in UnixNano
	m         bufferMetrics

	mu     sync.Mutex
	fences map[string]*fence // by key range, as the router's map spells it
}

// fence is one key range whose owner refuses it.
type fence struct {
	lifted chan struct{} // closed when a probe got past the refusal, or the map changed
	probe  chan struct{} // holds one token: who takes it probes next, and gives it back
	wait   time.Duration // the next probe's wait; only the token's holder touches it
	since  time.Time
	// holders is how many held requests wait on the fence; guarded by rangeBuffer.mu.
	holders int
}

func newRangeBuffer(c config.Buffering, m bufferMetrics) *rangeBuffer {
	if !c.Enabled() {
		return nil
	}
	return &rangeBuffer{maxWait: c.MaxWait, maxHeld: int64(c.MaxRequests), m: m, fences: map[string]*fence{}}
}

// fenced reports whether req's key range is fenced now: a new request for it is held at once,
// without first being refused. Without a fence anywhere it costs one atomic load.
func (s *Server) fenced(req idem.TransferRequest) bool {
	b := s.buffer
	if b == nil || b.nfences.Load() == 0 {
		return false
	}
	kr, _, _ := s.fenceKey(req)
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fences[kr] != nil
}

// join adds a held request to the fence of key range kr, made if there is none.
func (b *rangeBuffer) join(kr string) (f *fence, made bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f = b.fences[kr]; f != nil {
		f.holders++
		return f, false
	}
	f = &fence{lifted: make(chan struct{}), probe: make(chan struct{}, 1), wait: firstProbeWait, since: time.Now(), holders: 1}
	f.probe <- struct{}{}
	b.fences[kr] = f
	b.nfences.Store(int64(len(b.fences)))
	return f, true
}

// leave takes a held request off kr's fence f; the last one to leave forgets the fence, so that
// the next request for kr is tried before it is held.
func (b *rangeBuffer) leave(kr string, f *fence) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f.holders--
	if f.holders == 0 && b.fences[kr] == f {
		delete(b.fences, kr)
		b.nfences.Store(int64(len(b.fences)))
	}
}

// lift releases every request held for kr's fence f, if f is still its fence.
func (b *rangeBuffer) lift(kr string, f *fence) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fences[kr] == f {
		delete(b.fences, kr)
		b.nfences.Store(int64(len(b.fences)))
		close(f.lifted)
	}
}

// mapChanged releases every held request: under the new map, each goes to the shard that owns
// its range now, and is held again if that shard refuses it too. Nil-safe.
func (b *rangeBuffer) mapChanged() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range b.fences {
		close(f.lifted)
	}
	clear(b.fences)
	b.nfences.Store(0)
}

// take reserves a place for one held request, or reports that max_requests are held already.
func (b *rangeBuffer) take() bool {
	if b.held.Add(1) > b.maxHeld {
		b.held.Add(-1)
		return false
	}
	b.m.held.Inc()
	return true
}

func (b *rangeBuffer) give() {
	b.held.Add(-1)
	b.m.held.Dec()
}

// checkDue reports whether a held request should read the map file now; at most one does per
// mapCheckEvery.
func (b *rangeBuffer) checkDue(now time.Time) bool {
	last := b.lastCheck.Load()
	return now.UnixNano()-last >= int64(mapCheckEvery) && b.lastCheck.CompareAndSwap(last, now.UnixNano())
}

// attempt is one try of a transfer on the shard its range belongs to in the map of Version.
type attempt struct {
	shard   string
	version int64
	res     idem.TransferResult
	err     error
}

// refused reports an attempt the shard refused as not its range's owner.
func (a attempt) refused() bool { return a.err == nil && a.res.Outcome == idem.NotOwner }

// tryOnce runs req on the shard that owns it in the current map (or, while that shard has not
// been granted the range, on its previous owner: tryIn); a shard that follows a newer map than
// the router's makes the router reload and try once more there.
func (s *Server) tryOnce(ctx context.Context, req idem.TransferRequest) attempt {
	topo := s.HoldTopology()
	a := s.tryIn(ctx, topo, req)
	topo.Release()
	if a.refused() && a.res.ShardMapVersion > a.version {
		// The shard's ownership check is what keeps a stale router from applying anywhere.
		if s.ReloadAtLeast(a.res.ShardMapVersion) {
			topo = s.HoldTopology()
			a = s.tryIn(ctx, topo, req)
			topo.Release()
		}
	}
	return a
}

// tryIn runs req on its range's owner in topo. An owner that refuses it without following a
// newer map than topo's has not been granted the range yet: the range may be moving to it, and
// while the range's rows are copied its owner in the previous map still holds it and applies
// it. So req goes there too, and the range's next requests go there first (prevFirst) until it
// refuses them in turn. The shards' ownership checks let at most one of the two apply a
// request; a retry later replays from whichever did, the new owner holding a copy of what the
// old one stored once it is granted the range. (A refusal from a newer map is tryOnce's: it
// reloads.)
func (s *Server) tryIn(ctx context.Context, topo *topology.Topology, req idem.TransferRequest) attempt {
	owner, kr := topo.Map.ShardFor(req.KeyspaceID)
	version := topo.Map.Version
	old := s.previousOwner(topo, req.KeyspaceID, owner)
	triedOld := false
	if old != nil && s.prevFirst.fresh(kr.Lo(), time.Now()) {
		name, res, err := s.transferAt(ctx, topo, old, req)
		if b := (attempt{shard: name, version: version, res: res, err: err}); !b.refused() {
			return b
		}
		s.prevFirst.forget(kr.Lo()) // the fence has begun, or the move is over
		triedOld = true
	}
	name, res, err := s.transferAt(ctx, topo, owner, req)
	a := attempt{shard: name, version: version, res: res, err: err}
	if !a.refused() || res.ShardMapVersion > version || old == nil || triedOld {
		return a
	}
	name, res, err = s.transferAt(ctx, topo, old, req)
	if b := (attempt{shard: name, version: version, res: res, err: err}); !b.refused() || res.ShardMapVersion > version {
		if !b.refused() {
			s.prevFirst.remember(kr.Lo(), time.Now())
		}
		return b
	}
	return a
}

// previousOwner is the shard of topo that owned keyspace id ks in the map served before topo's,
// if that is another shard than owner; nil otherwise.
func (s *Server) previousOwner(topo *topology.Topology, ks uint64, owner *shardmap.Shard) *shardmap.Shard {
	prev := s.prevMap.Load()
	if prev == nil || prev.Version >= topo.Map.Version {
		return nil
	}
	was, _ := prev.ShardFor(ks)
	if was == nil || owner == nil || was.Name == owner.Name {
		return nil
	}
	return topo.Map.Shard(was.Name)
}

// onPreviousOwner runs fn, a read, on the shard of topo that owned keyspace id ks in the previous
// map, when that is another shard than owner, the one that just failed to answer it (it does not
// hold the range's rows yet): while a range's rows are copied, its previous owner holds them.
// ok is false when there is no such shard.
func (s *Server) onPreviousOwner(topo *topology.Topology, ks uint64, owner string, fn func(*topology.Shard) error) (shard string, ok bool, err error) {
	old := s.previousOwner(topo, ks, topo.Map.Shard(owner))
	if old == nil {
		return owner, false, nil
	}
	conn := topo.Shard(old.Name)
	if err := conn.Enter(); err != nil {
		return old.Name, true, err
	}
	defer conn.Leave()
	return old.Name, true, fn(conn)
}

// prevFirstFor is how long a range's requests go to its previous owner first after that owner
// applied one its new owner refused. Its refusal ends it sooner.
const prevFirstFor = time.Second

// rangeHints remembers, by the start of a key range of the current map, until when the range's
// requests go to its previous owner first: while its rows are copied, the new owner would only
// refuse them, taking a turn of its group commit from the ranges it does own.
type rangeHints struct {
	n     atomic.Int64 // len(until), read without the lock
	mu    sync.Mutex
	until map[uint64]time.Time
}

func (h *rangeHints) fresh(lo uint64, now time.Time) bool {
	if h.n.Load() == 0 {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	until, ok := h.until[lo]
	if ok && !now.Before(until) {
		delete(h.until, lo)
		h.n.Store(int64(len(h.until)))
	}
	return now.Before(until)
}

func (h *rangeHints) remember(lo uint64, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.until == nil {
		h.until = map[uint64]time.Time{}
	}
	h.until[lo] = now.Add(prevFirstFor)
	h.n.Store(int64(len(h.until)))
}

func (h *rangeHints) forget(lo uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.until, lo)
	h.n.Store(int64(len(h.until)))
}

// reset forgets every hint: they speak of the ranges of a map no longer served.
func (h *rangeHints) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	clear(h.until)
	h.n.Store(0)
}

// mapSwapped records prev, the map served until now, and lets every held request go to its
// range's owner in the new map.
func (s *Server) mapSwapped(prev *shardmap.Map) {
	s.prevMap.Store(prev)
	s.prevFirst.reset()
	s.buffer.mapChanged()
}

// fenceKey is the key range that holds req's keyspace id in the current map, its owner there
// and the map's version.
func (s *Server) fenceKey(req idem.TransferRequest) (kr, shard string, version int64) {
	m := s.topo.Load().Map
	sh, r := m.ShardFor(req.KeyspaceID)
	return r.String(), sh.Name, m.Version
}

// holdFenced holds req, whose range's owner refused it (prev, or nothing yet when its range
// was known to be fenced), until a shard takes it, buffering.max_wait passes, ctx ends (the
// request's deadline) or the client goes away (client ends), and returns the last attempt.
// A request that finds max_requests held is not held: it gets its refusal, tried first if it
// had none.
func (s *Server) holdFenced(ctx, client context.Context, req idem.TransferRequest, prev *attempt) attempt {
	b := s.buffer
	if !b.take() {
		b.m.outcomes.WithLabelValues(bufOverflow).Inc()
		if prev == nil {
			return s.tryOnce(ctx, req)
		}
		return *prev
	}
	defer b.give()
	start := time.Now()
	outcome := bufTimeout
	defer func() {
		b.m.outcomes.WithLabelValues(outcome).Inc()
		b.m.wait.Observe(time.Since(start).Seconds())
	}()
	var last attempt
	if prev != nil {
		last = *prev
	} else {
		_, shard, version := s.fenceKey(req)
		last = attempt{shard: shard, version: version, res: idem.TransferResult{Outcome: idem.NotOwner}}
	}
	bound := time.NewTimer(b.maxWait)
	defer bound.Stop()
	var (
		f  *fence
		fk string // f's key range
	)
	defer func() {
		if f != nil {
			b.leave(fk, f)
		}
	}()
	for {
		if kr, owner, version := s.fenceKey(req); f == nil || kr != fk || isClosed(f.lifted) {
			if f != nil {
				b.leave(fk, f)
			}
			var made bool
			f, made = b.join(kr)
			fk = kr
			if made {
				s.log.Info("holding requests for a key range its owner refuses, until a shard takes it",
					"range", kr, "owner", owner, "router_map_version", version, "refused_by", last.shard, "shard_map_version", last.res.ShardMapVersion)
			}
		}
		probing, stop := waitTurn(ctx, client, f, bound.C)
		if stop != "" {
			outcome = stop
			return last
		}
		a := s.tryOnce(ctx, req)
		if !a.refused() {
			if probing {
				b.lift(fk, f)
				s.log.Info("a key range's requests are sent on: a shard takes it", "range", fk, "shard", a.shard, "fenced_for", time.Since(f.since))
			}
			outcome = bufSent
			return a
		}
		last = a
		if a.res.ShardMapVersion >= a.version && b.checkDue(time.Now()) {
			// The shard follows a map no older than the router's and still refuses: the range is
			// moving to a map the router may not have read yet. A reload that applies lifts
			// every fence (mapChanged).
			s.Reload(s.cfg.ShardmapPath) //nolint:errcheck // Reload logs and counts its result
		}
		if probing {
			f.wait = min(2*f.wait, maxProbeWait)
			f.probe <- struct{}{}
		}
	}
}

// waitTurn waits until f is lifted or it is this request's turn to probe (f.wait after taking
// the turn), and reports which. stop is the outcome to end the holding with when the bound, ctx
// (the request's deadline) or the client ended the wait first, "" otherwise; a prober that
// stops hands its turn on.
func waitTurn(ctx, client context.Context, f *fence, bound <-chan time.Time) (probing bool, stop string) {
	select {
	case <-f.lifted:
		return false, ""
	case <-f.probe:
	case <-bound:
		return false, bufTimeout
	case <-ctx.Done():
		return false, bufTimeout
	case <-client.Done():
		return false, bufCanceled
	}
	pause := time.NewTimer(f.wait)
	defer pause.Stop()
	select {
	case <-pause.C:
		return true, ""
	case <-f.lifted:
		return true, ""
	case <-bound:
		stop = bufTimeout
	case <-ctx.Done():
		stop = bufTimeout
	case <-client.Done():
		stop = bufCanceled
	}
	f.probe <- struct{}{}
	return true, stop
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
