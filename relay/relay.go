// Package relay delivers the credits that debits owe: every `router serve` runs one. The router
// that wrote a debit hands its credit to its relay at once (handoff.go); the debit's own
// transaction leased it to that relay. Passes are the safety net: they claim the other
// owed credits on each shard (FOR UPDATE SKIP LOCKED plus a lease, so any number of router
// replicas relay side by side and one takes over a row whose lease ran out), delivers them to
// the shard that owns dst through the same group functions as any transfer (kind transfer_in,
// keyed by the transfer id, with its ledger row as its record), and only then marks them settled
// on the debit's shard. A delivery
// that committed but was never acknowledged is simply delivered again: it replays, and the
// ledger's unique (transfer_id, kind) makes a second credit impossible in any case.
package relay

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// Topologies is what the relay needs of the router it runs in: the topology to route with, and
// a reload when a shard says the router's map is older than its own.
type Topologies interface {
	// HoldTopology returns the current topology, held until its Release.
	HoldTopology() *topology.Topology
	// ReloadAtLeast reloads the shard map unless it is at version already, and reports whether
	// it is now.
	ReloadAtLeast(version int64) bool
}

// Relay delivers owed credits: those its router's debits owe at once (Handoff), and, in passes
// (Run), whatever other relays left owed. Notify makes it pass at once.
type Relay struct {
	cfg       config.Relay
	retention time.Duration
	timeout   time.Duration // of one claim, delivery or settle statement
	topos     Topologies
	log       *slog.Logger
	owner     string
	wake      chan struct{}
	metrics   *metrics

	mu       sync.Mutex
	down     map[string]shardBackoff // source shards whose claims fail, by name
	observed map[string]bool         // shards with owed-credit gauges
	reowe    map[string]bool         // destination shards whose recent credits are to be owed again

	handoffs handoffs // the fast path (handoff.go)
}

type shardBackoff struct {
	until    time.Time
	failures int
}

// New makes a relay for the router whose configuration is cfg; owner is its name in leases
// (NewOwner), and its metrics go to reg.
func New(cfg *config.Config, owner string, topos Topologies, log *slog.Logger, reg prometheus.Registerer) *Relay {
	r := &Relay{
		cfg: cfg.Relay, retention: cfg.Idempotency.Retention, timeout: cfg.ShardPool.RequestTimeout,
		topos: topos, log: log, owner: owner, wake: make(chan struct{}, 1),
		metrics: newMetrics(reg), down: map[string]shardBackoff{}, observed: map[string]bool{},
		reowe:    map[string]bool{},
		handoffs: handoffs{slots: make(chan struct{}, maxHandoffsPerBatch*max(cfg.Relay.Batch, 1))},
	}
	topo := topos.HoldTopology()
	topo.OnIdentityChange(r.identityChanged)
	topo.Release()
	return r
}

// NewOwner names a relay in the leases it takes: host, process and a random part, so that two
// relays never share a name.
func NewOwner() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	crand.Read(b) //nolint:errcheck // crypto/rand.Read never fails
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Notify makes the relay pass at once (a destination shard to re-owe was marked); it never
// blocks, and notifications that arrive during a pass make one more pass.
func (r *Relay) Notify() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run delivers until ctx ends: a pass over every shard on each notification and every
// relay.poll_interval, the latter also refreshing the owed-credit gauges.
func (r *Relay) Run(ctx context.Context) {
	tick := time.NewTicker(r.cfg.PollInterval)
	defer tick.Stop()
	for {
		stats := false
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-tick.C:
			stats = true
		}
		r.Pass(ctx)
		if stats {
			r.Observe(ctx)
		}
	}
}

// Pass claims and delivers what every shard owes now, until each has nothing due, and returns
// how many credits it settled.
func (r *Relay) Pass(ctx context.Context) int {
	settled := r.pass(ctx)
	if r.marked() {
		// A pass's claims are what connect to a repointed shard first, and so what finds its
		// identity changed: owe again what it may have lost, and deliver it, at once.
		settled += r.pass(ctx)
	}
	return settled
}

// pass is one Pass over every shard.
func (r *Relay) pass(ctx context.Context) int {
	topo := r.topos.HoldTopology()
	defer topo.Release()
	r.reoweMarked(ctx, topo)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		settled int
	)
	for _, sh := range topo.Map.Shards {
		if !r.due(sh.Name) {
			continue
		}
		wg.Go(func() {
			n := r.drain(ctx, topo, sh.Name)
			mu.Lock()
			settled += n
			mu.Unlock()
		})
	}
	wg.Wait()
	return settled
}

// drain delivers source's owed credits, a claim of relay.batch at a time, until a claim comes
// back short.
func (r *Relay) drain(ctx context.Context, topo *topology.Topology, source string) int {
	settled := 0
	for ctx.Err() == nil {
		credits, err := r.claim(ctx, topo, source)
		if err != nil {
			r.shardFailed(topo, source, "claim owed credits", err)
			return settled
		}
		r.shardOK(source)
		settled += r.deliver(ctx, topo, source, credits)
		if len(credits) < r.cfg.Batch {
			break
		}
	}
	return settled
}

func (r *Relay) claim(ctx context.Context, topo *topology.Topology, source string) ([]idem.OwedCredit, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	credits, err := idem.ClaimCredits(ctx, topo.Pool(source), r.owner, r.cfg.Batch, r.cfg.Lease)
	for _, c := range credits {
		if c.TakenOver {
			r.metrics.takenOver.WithLabelValues(source).Inc()
		}
	}
	return credits, err
}

// deliver sends credits, claimed on source, to the shards that own their dst, a group per
// destination, and returns how many it settled.
func (r *Relay) deliver(ctx context.Context, topo *topology.Topology, source string, credits []idem.OwedCredit) int {
	byDest := map[string][]idem.OwedCredit{}
	for _, c := range credits {
		dest, _ := topo.Map.ShardFor(shardmap.KeyspaceID(c.Dst))
		byDest[dest.Name] = append(byDest[dest.Name], c)
	}
	settled := 0
	for dest, group := range byDest {
		settled += r.deliverTo(ctx, topo, source, dest, group)
	}
	return settled
}

// deliverTo delivers group to dest in one statement (each credit alone if dest refuses the
// statement), then settles on source what landed and defers the rest.
func (r *Relay) deliverTo(ctx context.Context, topo *topology.Topology, source, dest string, group []idem.OwedCredit) int {
	results, failed, err := r.send(ctx, topo, dest, group)
	if err != nil {
		r.metrics.deliveries.WithLabelValues(dest, "error").Add(float64(len(group)))
		r.log.Warn("credit delivery failed; the credits stay owed and are retried with backoff",
			"from", source, "to", dest, "credits", len(group), "err", scrub(topo, err))
		r.reschedule(ctx, topo, source, ids(group), "deliver to "+dest+": "+scrub(topo, err))
		return 0
	}
	var landed []string
	retry := map[string][]string{} // reason → transfer ids
	newer := int64(0)
	for i, res := range results {
		v := r.judge(topo, source, dest, group[i].TransferID, res, failed[i])
		if v.landed {
			landed = append(landed, group[i].TransferID)
		} else {
			retry[v.retry] = append(retry[v.retry], group[i].TransferID)
		}
		newer = max(newer, v.newer)
	}
	if newer > topo.Map.Version {
		r.topos.ReloadAtLeast(newer)
	}
	for reason, ids := range retry {
		r.reschedule(ctx, topo, source, ids, reason)
	}
	settled := r.settle(ctx, topo, source, dest, landed)
	r.observeDelays(dest, group, settled)
	return len(settled)
}

// verdict is what one delivery's answer means for its owed credit.
type verdict struct {
	landed bool   // the credit is in dst's ledger: settle it
	retry  string // otherwise why it stays owed, for last_error
	newer  int64  // the map version dest follows, when it does not own dst
}

// judge reads the answer dest gave to the delivery of credit id, owed by source (failed: the
// error of a credit dest refused alone), counts it in shardgate_credit_deliveries_total and
// logs what an operator must see.
func (r *Relay) judge(topo *topology.Topology, source, dest, id string, res idem.TransferResult, failed error) verdict {
	var v verdict
	label := string(res.Outcome)
	switch {
	case failed != nil:
		label = "error"
		r.log.Warn("dst's shard refused a credit; it stays owed and is retried with backoff",
			"from", source, "to", dest, "transfer_id", id, "err", scrub(topo, failed))
		v.retry = "deliver to " + dest + ": " + scrub(topo, failed)
	case res.Outcome == idem.Applied:
		label, v.landed = "settled", true
	case res.Outcome == idem.Replayed, res.Outcome == idem.Expired, res.Outcome == idem.RecordMissing:
		// The credit is in dst's ledger already: an earlier delivery committed.
		label, v.landed = "replayed", true
	case res.Outcome == idem.InProgress:
		v.retry = "another delivery of this credit is in flight"
	case res.Outcome == idem.NotOwner:
		v.newer = res.ShardMapVersion
		v.retry = fmt.Sprintf("shard %s does not own dst (its map version %d, the relay's %d)", dest, res.ShardMapVersion, topo.Map.Version)
	case res.Outcome == idem.KeyReused:
		label = "conflict"
		r.log.Error("CREDIT CONFLICT: dst's shard holds a different credit under this transfer id; the credit stays owed, run `router reconcile`",
			"from", source, "to", dest, "transfer_id", id)
		v.retry = "a different credit holds this transfer id"
	}
	r.metrics.deliveries.WithLabelValues(dest, label).Inc()
	return v
}

// observeDelays records, for each credit of group now settled, the time from its debit to its
// credit. Both times are as the shards' ledgers hold them (debited_at on the source, the
// credit's created_at on dest): each is its transaction's time on its own shard's clock, so the
// delay is exact up to the skew between the two clocks, which NTP keeps to about a millisecond;
// a delay that skew makes negative counts as 0.
func (r *Relay) observeDelays(dest string, group []idem.OwedCredit, settled map[string]time.Time) {
	for _, c := range group {
		if at, ok := settled[c.TransferID]; ok {
			r.metrics.delay.WithLabelValues(dest).Observe(max(at.Sub(c.DebitedAt).Seconds(), 0))
		}
	}
}

// send runs the credit legs of group on dest, as one group. If the shard refuses the group
// (a statement error: nothing committed), each credit is sent alone, and failed[i] is the error
// of a credit refused alone: the others are not held up by it. err means nothing is known of
// any credit (the shard is unreachable, busy, or timed out).
func (r *Relay) send(ctx context.Context, topo *topology.Topology, dest string, group []idem.OwedCredit) (res []idem.TransferResult, failed []error, err error) {
	conn := topo.Shard(dest)
	if err := conn.Enter(); err != nil {
		return nil, nil, err
	}
	defer conn.Leave()
	reqs := make([]idem.TransferRequest, len(group))
	for i, c := range group {
		reqs[i] = idem.CreditRequest(c, shardmap.KeyspaceID(c.Dst), r.retention)
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	// A credit is settled only once it is known to be on dest's synchronous standby, as a
	// transfer is acknowledged: not after a commit whose wait for the standby was cancelled,
	// and, for a credit found there already, only after a commit that waited for it.
	ctx, check := topology.WatchCommits(ctx)
	res, failed, err = r.sendOn(ctx, conn, reqs)
	if err == nil {
		err = check()
	}
	if err == nil && slices.ContainsFunc(res, func(x idem.TransferResult) bool { return x.Outcome == idem.Replayed }) {
		err = conn.ConfirmReplicated(ctx)
	}
	if err != nil {
		return nil, nil, err
	}
	return res, failed, nil
}

// sendOn sends reqs to conn's shard in one statement, or each alone if the shard refuses it.
func (r *Relay) sendOn(ctx context.Context, conn *topology.Shard, reqs []idem.TransferRequest) (res []idem.TransferResult, failed []error, err error) {
	failed = make([]error, len(reqs))
	res, err = idem.TransferBatch(ctx, conn.Pool, reqs)
	if !refused(err) {
		return res, failed, err
	}
	res = make([]idem.TransferResult, len(reqs))
	if len(reqs) == 1 {
		failed[0] = err // refused alone already
		return res, failed, nil
	}
	for i := range reqs {
		res[i], err = idem.Transfer(ctx, conn.Pool, reqs[i])
		switch {
		case refused(err):
			failed[i] = err
		case err != nil:
			return nil, nil, err
		}
	}
	return res, failed, nil
}

// refused reports whether err is the shard's answer to a statement, which then committed
// nothing; any other error leaves its outcome unknown.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// settle marks landed (credits now in dest's ledger) settled on source, at their time in dest's
// ledger, and returns those it settled with their time there. If this fails the leases run out
// and the credits are delivered again: they replay.
func (r *Relay) settle(ctx context.Context, topo *topology.Topology, source, dest string, landed []string) map[string]time.Time {
	if len(landed) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	times, err := idem.CreditTimes(ctx, topo.Pool(dest), landed)
	if err == nil {
		err = idem.SettleCredits(ctx, topo.Pool(source), times)
	}
	if err != nil {
		r.log.Warn("credits delivered but not marked settled; they will be delivered again and replay",
			"from", source, "to", dest, "credits", len(landed), "err", scrub(topo, err))
		return nil
	}
	var missing []string
	for _, id := range landed {
		if _, ok := times[id]; !ok {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		// Delivered, yet gone from dest on reading back: dst's range moved away in between. The
		// next delivery goes to the new owner and replays there.
		r.reschedule(ctx, topo, source, missing, "delivered to "+dest+" but not found there afterwards (dst's range moved?)")
	}
	return times
}

// reschedule gives back the leases of ids on source with reason, each due again after its backoff.
func (r *Relay) reschedule(ctx context.Context, topo *topology.Topology, source string, ids []string, reason string) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	if err := idem.DeferCredits(ctx, topo.Pool(source), r.owner, ids, reason, idem.Backoff{Base: r.cfg.BackoffBase, Max: r.cfg.BackoffMax}); err != nil {
		// The leases run out instead; the credits are claimed again then.
		r.log.Warn("could not reschedule owed credits", "shard", source, "err", scrub(topo, err))
	}
}

func ids(group []idem.OwedCredit) []string {
	out := make([]string, len(group))
	for i, c := range group {
		out[i] = c.TransferID
	}
	return out
}

// due reports whether source may be tried now: a shard whose claims failed waits out its
// backoff.
func (r *Relay) due(source string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return time.Now().After(r.down[source].until)
}

// shardFailed backs source off: relay.backoff_base doubled per consecutive failure, at most
// relay.backoff_max, with jitter.
func (r *Relay) shardFailed(topo *topology.Topology, source, what string, err error) {
	r.mu.Lock()
	b := r.down[source]
	b.failures++
	wait := backoff(r.cfg.BackoffBase, r.cfg.BackoffMax, b.failures)
	b.until = time.Now().Add(wait)
	r.down[source] = b
	r.mu.Unlock()
	r.log.Warn("relay: shard unavailable; its owed credits wait", "shard", source, "what", what,
		"retry_in", wait.Round(time.Millisecond).String(), "err", scrub(topo, err))
}

func (r *Relay) shardOK(source string) {
	r.mu.Lock()
	delete(r.down, source)
	r.mu.Unlock()
}

// backoff is base·2^(n-1), at most max, scaled by a random factor in [0.5, 1.5).
func backoff(base, limit time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < limit; i++ {
		d *= 2
	}
	d = min(d, limit)
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}

// Observe refreshes the owed-credit gauges of every shard of the current map, and drops those of
// shards the map no longer has: a removed shard's last age would otherwise hold the alert on
// credits owed too long firing for good.
func (r *Relay) Observe(ctx context.Context) {
	topo := r.topos.HoldTopology()
	defer topo.Release()
	inMap := make(map[string]bool, len(topo.Map.Shards))
	for _, sh := range topo.Map.Shards {
		inMap[sh.Name] = true
		// A conflict is rare and alerted on with increase(): its series must exist at 0 first.
		r.metrics.deliveries.WithLabelValues(sh.Name, "conflict")
		ctx, cancel := context.WithTimeout(ctx, r.timeout)
		owed, oldest, err := idem.OwedStats(ctx, topo.Pool(sh.Name))
		cancel()
		if err != nil {
			continue // the shard is down: its gauges keep their last values
		}
		r.metrics.owed.WithLabelValues(sh.Name).Set(float64(owed))
		age := 0.0
		if owed > 0 {
			age = time.Since(oldest).Seconds()
		}
		r.metrics.oldest.WithLabelValues(sh.Name).Set(age)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for name := range r.observed {
		if !inMap[name] {
			r.metrics.owed.DeleteLabelValues(name)
			r.metrics.oldest.DeleteLabelValues(name)
		}
	}
	r.observed = inMap
}

// scrub is err's text with every shard's password masked: connection errors may quote a DSN.
func scrub(topo *topology.Topology, err error) string {
	text := err.Error()
	for _, sh := range topo.Map.Shards {
		text = sh.Scrub(text)
	}
	return text
}
