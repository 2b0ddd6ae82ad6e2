package relay

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shardgate/shardgate/groupcommit"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// A handoff is the fast path of the credit leg. The router that wrote a debit delivers its credit
// at once, instead of leaving it for a relay's next pass: the debit's own transaction wrote the
// owed row leased to this relay (the router's connections carry idem.CreditLeaseSettings), so no
// claim is needed; the credit goes to dst's shard through the router's group commit for that
// shard, in one statement with the shard's other new transfers; and the settle on the source
// rides in one statement with the other settles bound there. A debit and its credit then cost
// the shards a commit each, plus a share of a settle.
//
// The pass stays the safety net. A credit whose delivery fails is given back (rescheduled with
// backoff, as a pass does); one this router never got to (it died, or too many handoffs were in
// flight) waits out its lease (relay.lease) and is claimed by a pass then, as any other.

// Committer runs a transfer attempt on a shard through the router's group commit for that
// shard: router.Server's Commit.
type Committer interface {
	Commit(ctx context.Context, shard string, conn *topology.Shard, req idem.TransferRequest) (idem.TransferResult, error)
}

// maxHandoffsPerBatch bounds the handoffs in flight at once, in relay.batch: more are left to
// the pass once their lease runs out.
const maxHandoffsPerBatch = 4

type settler = groupcommit.Batcher[string, struct{}]

// handoffs is the relay's fast path: its bound, what is in flight, and the settles of each source
// shard.
type handoffs struct {
	via      Committer     // nil: each credit is sent alone
	slots    chan struct{} // one per handoff in flight
	inFlight sync.WaitGroup
	settlers sync.Map // source shard name → *settler
}

// DeliverThrough makes handed-off credits travel through c, the router's group commit, with the
// destination shard's other new transfers. Call it before serving.
func (r *Relay) DeliverThrough(c Committer) { r.handoffs.via = c }

// Handoff delivers, now and in the background, the credit that a debit just applied on source
// by this router left owed; req is the debit's request. It never blocks: with too many handoffs
// in flight it leaves the credit to a pass, which claims it when its lease runs out.
func (r *Relay) Handoff(source string, req idem.TransferRequest) {
	select {
	case r.handoffs.slots <- struct{}{}:
	default:
		r.metrics.handoffsSkipped.Inc()
		return
	}
	c := idem.OwedCredit{TransferID: req.TransferID, Src: req.Src, Dst: req.Dst, Amount: req.Amount,
		Currency: req.Currency, Reference: req.Reference, Client: req.Client, Attempts: 1}
	debited := time.Now()
	r.handoffs.inFlight.Go(func() {
		defer func() { <-r.handoffs.slots }()
		r.handOff(source, c, debited)
	})
}

// Wait returns once every credit handed off so far is delivered and settled, or given back.
func (r *Relay) Wait() { r.handoffs.inFlight.Wait() }

// handOff delivers c, owed by source and debited at debited, then settles it or gives it back.
func (r *Relay) handOff(source string, c idem.OwedCredit, debited time.Time) {
	topo := r.topos.HoldTopology()
	defer topo.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 2*r.timeout)
	defer cancel()
	dest, _ := topo.Map.ShardFor(shardmap.KeyspaceID(c.Dst))
	res, err := r.deliverOne(ctx, topo, dest.Name, c)
	if err != nil {
		r.metrics.deliveries.WithLabelValues(dest.Name, "error").Inc()
		r.log.Warn("credit delivery failed; the credit stays owed and is retried with backoff",
			"from", source, "to", dest.Name, "transfer_id", c.TransferID, "err", scrub(topo, err))
		r.reschedule(ctx, topo, source, []string{c.TransferID}, "deliver to "+dest.Name+": "+scrub(topo, err))
		return
	}
	v := r.judge(topo, source, dest.Name, c.TransferID, res, nil)
	if !v.landed {
		if v.newer > topo.Map.Version {
			r.topos.ReloadAtLeast(v.newer)
		}
		r.reschedule(ctx, topo, source, []string{c.TransferID}, v.retry)
		return
	}
	delay := time.Since(debited)
	if _, err := r.settlerOf(source).Do(ctx, c.TransferID); err != nil {
		r.log.Warn("credit delivered but not marked settled; it will be delivered again once its lease runs out, and replay",
			"from", source, "to", dest.Name, "transfer_id", c.TransferID, "err", scrub(topo, err))
		return
	}
	// Observed once settled, as a pass observes it: a count of delays is a count of settles.
	r.metrics.delay.WithLabelValues(dest.Name).Observe(delay.Seconds())
}

// deliverOne runs c's credit leg on dest: through the router's group commit when there is one.
// As for a pass, an answer from a record dest held already counts only once a commit that waited
// for dest's synchronous standby covers it.
func (r *Relay) deliverOne(ctx context.Context, topo *topology.Topology, dest string, c idem.OwedCredit) (idem.TransferResult, error) {
	conn := topo.Shard(dest)
	if err := conn.Enter(); err != nil {
		return idem.TransferResult{}, err
	}
	defer conn.Leave()
	req := idem.CreditRequest(c, shardmap.KeyspaceID(c.Dst), r.retention)
	var (
		res idem.TransferResult
		err error
	)
	if r.handoffs.via != nil {
		res, err = r.handoffs.via.Commit(ctx, dest, conn, req)
	} else {
		wctx, check := topology.WatchCommits(ctx)
		if res, err = idem.Transfer(wctx, conn.Pool, req); err == nil {
			err = check()
		}
	}
	if err == nil && res.Outcome == idem.Replayed {
		err = conn.ConfirmReplicated(ctx)
	}
	return res, err
}

// settlerOf returns source's settler: it marks delivered credits settled on source, those that
// arrive while a settle is in flight together in the next one.
func (r *Relay) settlerOf(source string) *settler {
	if s, ok := r.handoffs.settlers.Load(source); ok {
		return s.(*settler)
	}
	s, _ := r.handoffs.settlers.LoadOrStore(source, groupcommit.New(groupcommit.Options{MaxBatch: r.cfg.Batch, Parallel: 1},
		func(ids []string) []groupcommit.Result[struct{}] {
			err := r.settleDelivered(source, ids)
			out := make([]groupcommit.Result[struct{}], len(ids))
			for i := range out {
				out[i].Err = err
			}
			return out
		}))
	return s.(*settler)
}

// settleDelivered marks ids settled on source, in the current topology.
func (r *Relay) settleDelivered(source string, ids []string) error {
	topo := r.topos.HoldTopology()
	defer topo.Release()
	pool := topo.Pool(source)
	if pool == nil {
		return fmt.Errorf("shard %s is no longer in the shard map", source)
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	return idem.SettleDelivered(ctx, pool, ids)
}
