package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/relay"
	"github.com/shardgate/shardgate/shardmap"
)

// A router delivers the credits of its own debits at once (Handoff). Its connections wrote them
// leased to its relay, so another router's pass leaves them alone; each handed-off credit is
// then delivered once and settled, with no pass. A credit whose router died between its debit
// and its handoff stays leased until the lease runs out, then another relay's pass takes it over
// and delivers it: every credit lands exactly once.
func TestHandoffDeliversAtOnceAndThePassIsTheSafetyNet(t *testing.T) {
	ctx := context.Background()
	c, m, name, routerTopos, mine := handingOff(t)
	otherCfg := relayConfig(t)
	other := newRelay(otherCfg, newTopos(t, otherCfg, m))

	trs := pairs(append(accounts(t, "-80", 3), accounts(t, "80-", 3)...))
	c.debitOn(routerTopos.pool, m, trs)
	if n := other.Pass(ctx); n != 0 {
		t.Fatalf("another router's pass settled %d credits leased to the router that debited them", n)
	}

	var lost *transfer // its router died before handing it off
	handed := 0
	for i := range trs {
		tr := &trs[i]
		if !tr.owed {
			continue
		}
		if lost == nil {
			lost = tr
			continue
		}
		tr.handedOff = true
		mine.Handoff(owner(m, tr.src), debitRequest(*tr))
		handed++
	}
	mine.Wait()
	if p := c.pending(); len(p) != 1 || p[lost.id].leaseOwner == nil || *p[lost.id].leaseOwner != name {
		t.Fatalf("after the handoffs, pending credits %v; want only %s, leased to its router", p, lost.id)
	}
	settled := mine.deliveries(t, "a", "settled") + mine.deliveries(t, "b", "settled")
	if settled != float64(handed) {
		t.Errorf("the router delivered %v credits, want the %d it handed off", settled, handed)
	}
	if n := delaysObserved(t, mine); n != uint64(handed) {
		t.Errorf("shardgate_credit_delay_seconds observed %d credits, want %d", n, handed)
	}

	if n := other.Pass(ctx); n != 0 {
		t.Fatalf("a pass settled %d credits while the lost one's lease holds", n)
	}
	c.expireLeases()
	if n := other.Pass(ctx); n != 1 {
		t.Fatalf("after its lease ran out a pass settled %d credits, want the lost one", n)
	}
	if v, _ := other.metric(t, "shardgate_credit_leases_taken_over_total", "shard", owner(m, lost.src)); v != 1 {
		t.Errorf("leases taken over on %s: %v, want 1", owner(m, lost.src), v)
	}
	c.checkDelivered(m, trs)
}

// A handed-off credit that its destination refuses (dst's range is not owned there) is given
// back with its reason and backoff, no longer leased: a pass delivers it once it is due.
func TestHandoffRefusedIsGivenBack(t *testing.T) {
	ctx := context.Background()
	c, m, _, tp, r := handingOff(t)

	tr := transfer{id: "t-refused", src: accounts(t, "-80", 1)[0], dst: accounts(t, "80-", 1)[0], amount: 7}
	trs := []transfer{tr}
	c.debitOn(tp.pool, m, trs)
	if _, err := c.pool("b").Exec(ctx, "UPDATE shardgate_owned_range SET active = false"); err != nil {
		t.Fatal(err)
	}
	r.Handoff("a", debitRequest(trs[0]))
	r.Wait()
	row := c.pending()[tr.id]
	if row.leaseOwner != nil || row.lastError == nil || row.nextAttempt.IsZero() {
		t.Fatalf("refused handoff left %+v; want the lease given back with the reason", row)
	}
	if got := r.deliveries(t, "b", string(idem.NotOwner)); got != 1 {
		t.Errorf("deliveries to b not_owner: %v, want 1", got)
	}

	if _, err := c.pool("b").Exec(ctx, "UPDATE shardgate_owned_range SET active = true"); err != nil {
		t.Fatal(err)
	}
	c.makeDue()
	if n := r.Pass(ctx); n != 1 {
		t.Fatalf("the pass after dst took its range back settled %d credits, want 1", n)
	}
	c.checkDelivered(m, trs)
}

// handingOff is a cluster of two shards a and b, each owning half the keyspace under m, and a
// router's relay that hands off: named name, with tp the router's connections, which write owed
// credits leased to it for an hour.
func handingOff(t *testing.T) (c *cluster, m *shardmap.Map, name string, tp *topos, r testRelay) {
	t.Helper()
	c = newCluster(t, "a", "b")
	m = c.mapOf(1, "a=-80 b=80-")
	c.apply(m)
	cfg := relayConfig(t)
	name = relay.NewOwner()
	cfg.ShardPool.Session = idem.CreditLeaseSettings(name, time.Hour)
	tp = newTopos(t, cfg, m)
	return c, m, name, tp, newRelayAs(cfg, name, tp)
}

// delaysObserved is the count of shardgate_credit_delay_seconds over every destination of r.
func delaysObserved(t *testing.T, r testRelay) uint64 {
	t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, f := range families {
		if f.GetName() == "shardgate_credit_delay_seconds" {
			for _, m := range f.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return n
}
