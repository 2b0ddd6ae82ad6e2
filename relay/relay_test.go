package relay_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
)

// pairs is a transfer between every two distinct accounts of accts, in order.
func pairs(accts []int64) []transfer {
	var trs []transfer
	for _, src := range accts {
		for _, dst := range accts {
			if src != dst {
				trs = append(trs, transfer{id: fmt.Sprintf("t-%d-%d", src, dst), src: src, dst: dst, amount: src*100 + dst})
			}
		}
	}
	return trs
}

// A debit whose destination lives on its own shard writes the credit at once; any other owes it,
// and a pass delivers each owed credit once, on dst's shard, and settles its row at the credit's
// time. Balances show the owed credits as pending out, then as delivered.
func TestPassDeliversOwedCredits(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b")
	m := c.mapOf(1, "a=-80 b=80-")
	c.apply(m)
	trs := pairs(append(accounts(t, "-80", 4), accounts(t, "80-", 4)...))
	c.debit(m, trs)
	owed := 0
	for _, tr := range trs {
		if tr.owed {
			owed++
		}
	}
	if owed != 32 || len(c.pending()) != owed {
		t.Fatalf("%d credits owed, %d pending rows; want 32 of the 56 transfers (those across shards)", owed, len(c.pending()))
	}
	c.checkBalances(m, trs, true)

	cfg := relayConfig(t, "batch: 5") // several claims per shard
	r := newRelay(cfg, newTopos(t, cfg, m))
	if n := r.Pass(ctx); n != owed {
		t.Errorf("Pass settled %d credits, want %d", n, owed)
	}
	c.checkDelivered(m, trs)
	for _, shard := range []string{"a", "b"} {
		if got := r.deliveries(t, shard, "settled"); got != 16 {
			t.Errorf("deliveries to %s settled: %v, want 16", shard, got)
		}
	}
	if n := r.Pass(ctx); n != 0 {
		t.Errorf("a second Pass settled %d credits, want none", n)
	}
}

// A relay that dies after a credit committed on dst's shard and before it marked the row
// settled leaves the row leased; once the lease runs out another relay delivers it again,
// which replays: one credit, the row settled, counted as replayed and as taken over.
func TestRedeliveryAfterCrashReplays(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b")
	m := c.mapOf(1, "a=-80 b=80-")
	c.apply(m)
	src, dst := accounts(t, "-80", 1)[0], accounts(t, "80-", 1)[0]
	trs := []transfer{
		{id: "t-claimed", src: src, dst: dst, amount: 10},   // claimed and delivered by the dead relay
		{id: "t-delivered", src: src, dst: dst, amount: 20}, // delivered by a relay that died before settling
		{id: "t-untouched", src: src, dst: dst, amount: 30},
	}
	for i := range trs {
		c.debit(m, trs[i:i+1]) // one at a time: claims take the oldest first
	}
	credits, err := idem.ClaimCredits(ctx, c.pool("a"), "dead-relay", 1, time.Minute)
	if err != nil || len(credits) != 1 || credits[0].TransferID != "t-claimed" {
		t.Fatalf("claim: %+v, %v; want t-claimed", credits, err)
	}
	for _, oc := range []idem.OwedCredit{credits[0], owedCredit(trs[1])} {
		res, err := idem.Transfer(ctx, c.pool("b"), idem.CreditRequest(oc, shardmap.KeyspaceID(oc.Dst), 720*time.Hour))
		if err != nil || res.Outcome != idem.Applied {
			t.Fatalf("deliver %s: %v %v", oc.TransferID, res.Outcome, err)
		}
	}

	cfg := relayConfig(t)
	r := newRelay(cfg, newTopos(t, cfg, m))
	if n := r.Pass(ctx); n != 2 {
		t.Errorf("Pass settled %d credits, want 2 (the dead relay's lease holds the third)", n)
	}
	if p := c.pending(); len(p) != 1 || p["t-claimed"].leaseOwner == nil || *p["t-claimed"].leaseOwner != "dead-relay" {
		t.Fatalf("pending %+v, want only t-claimed, leased by dead-relay", p)
	}
	c.expireLeases()
	if n := r.Pass(ctx); n != 1 {
		t.Errorf("Pass after the lease ran out settled %d credits, want 1", n)
	}
	c.checkDelivered(m, trs)
	if got := r.deliveries(t, "b", "replayed"); got != 2 {
		t.Errorf("replayed deliveries: %v, want 2", got)
	}
	if got := r.deliveries(t, "b", "settled"); got != 1 {
		t.Errorf("settled deliveries: %v, want 1", got)
	}
	if got, _ := r.metric(t, "shardgate_credit_leases_taken_over_total", "shard", "a"); got != 1 {
		t.Errorf("leases taken over on a: %v, want 1", got)
	}
}

// Two relays (two routers) pass over the same shards at once, over 500 owed credits, 40 of them
// leased by a relay that died (half of those delivered): every credit is applied once and
// settled once, the dead relay's leases are taken over once each, its deliveries replay.
func TestTwoRelaysDeliverEachCreditOnce(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b", "c")
	m := c.mapOf(1, "a=-55 b=55-aa c=aa-")
	c.apply(m)
	var accts []int64
	for _, r := range []string{"-55", "55-aa", "aa-"} {
		accts = append(accts, accounts(t, r, 6)...)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var trs []transfer
	for len(trs) < 500 {
		src, dst := accts[rng.IntN(len(accts))], accts[rng.IntN(len(accts))]
		if owner(m, src) == owner(m, dst) {
			continue // owed credits only
		}
		trs = append(trs, transfer{id: fmt.Sprintf("t-%03d", len(trs)), src: src, dst: dst, amount: int64(1 + rng.IntN(1000))})
	}
	c.debit(m, trs)

	dead, err := idem.ClaimCredits(ctx, c.pool("a"), "dead-relay", 40, time.Minute)
	if err != nil || len(dead) != 40 {
		t.Fatalf("dead relay claimed %d credits (%v), want 40", len(dead), err)
	}
	for _, oc := range dead[:20] {
		if res, err := idem.Transfer(ctx, c.pool(owner(m, oc.Dst)), idem.CreditRequest(oc, shardmap.KeyspaceID(oc.Dst), 720*time.Hour)); err != nil || res.Outcome != idem.Applied {
			t.Fatalf("deliver %s: %v %v", oc.TransferID, res.Outcome, err)
		}
	}
	c.expireLeases()

	cfg := relayConfig(t, "batch: 16")
	relays := []testRelay{newRelay(cfg, newTopos(t, cfg, m)), newRelay(cfg, newTopos(t, cfg, m))}
	settled := make([]int, len(relays))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, r := range relays {
		wg.Go(func() {
			<-start
			for n := r.Pass(ctx); n > 0; n = r.Pass(ctx) {
				settled[i] += n
			}
		})
	}
	close(start)
	wg.Wait()

	if total := settled[0] + settled[1]; total != len(trs) {
		t.Errorf("the relays settled %d and %d credits, %d in all; want %d", settled[0], settled[1], total, len(trs))
	}
	c.checkDelivered(m, trs)
	var fresh, replayed, takenOver float64
	for _, r := range relays {
		for _, shard := range []string{"a", "b", "c"} {
			fresh += r.deliveries(t, shard, "settled")
			replayed += r.deliveries(t, shard, "replayed")
			v, _ := r.metric(t, "shardgate_credit_leases_taken_over_total", "shard", shard)
			takenOver += v
		}
	}
	if fresh != 480 || replayed != 20 || takenOver != 40 {
		t.Errorf("deliveries settled %v, replayed %v, leases taken over %v; want 480, 20 and 40", fresh, replayed, takenOver)
	}
}

// While dst's shard is down, its credits stay owed: each failed delivery defers the row by the
// backoff (base doubled per attempt, at most max, times [0.5, 1.5)), and records the error
// without the DSN's password. Once the shard is back they settle, once each.
func TestDestinationDownBacksOff(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b")
	m := c.mapOf(1, "a=-80 b=80-")
	c.apply(m)
	src, dsts := accounts(t, "-80", 1)[0], accounts(t, "80-", 3)
	var trs []transfer
	for i, dst := range dsts {
		trs = append(trs, transfer{id: fmt.Sprintf("t-%d", i), src: src, dst: dst, amount: 10})
	}
	c.debit(m, trs)

	// Backoffs far longer than a pass, so that no row falls due between two passes even on a
	// stalled machine (the shortest, with jitter, is half of backoff_base); makeDue stands in for
	// the wait.
	cfg := relayConfig(t, "backoff_base: 10s", "backoff_max: 30s")
	tp := newTopos(t, cfg, m)
	r := newRelay(cfg, tp)
	tp.serve(c.mapOf(1, "a=-80 b=80-", "b")) // b's DSN now reaches a closed port
	for attempt, delay := range []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second, 30 * time.Second} {
		before := dbNow(t, c)
		if n := r.Pass(ctx); n != 0 {
			t.Fatalf("Pass settled %d credits with b down", n)
		}
		after := dbNow(t, c)
		p := c.pending()
		if len(p) != len(trs) {
			t.Fatalf("%d credits pending, want %d", len(p), len(trs))
		}
		for id, o := range p {
			// The row was deferred at some time in [before, after].
			lo, hi := time.Duration(float64(delay)*0.5), time.Duration(float64(delay)*1.5)
			if o.attempts != attempt+1 || o.nextAttempt.Sub(before) < lo || o.nextAttempt.Sub(after) >= hi {
				t.Errorf("%s after failed attempt %d: attempts %d, due in %v to %v; want %d, within [%v, %v)",
					id, attempt+1, o.attempts, o.nextAttempt.Sub(after), o.nextAttempt.Sub(before), attempt+1, lo, hi)
			}
			if o.lastError == nil || !strings.Contains(*o.lastError, "deliver to b") || strings.Contains(*o.lastError, secret) {
				t.Errorf("%s: last_error %v; want it to name b and not quote the password", id, o.lastError)
			}
		}
		if attempt == 0 {
			// Not due yet: a pass now leaves them alone.
			r.Pass(ctx)
			for id, o := range c.pending() {
				if o.attempts != 1 {
					t.Errorf("%s was tried again before its backoff ran out", id)
				}
			}
		}
		c.makeDue()
	}
	if got := r.deliveries(t, "b", "error"); got != 12 {
		t.Errorf("failed deliveries to b: %v, want 12", got)
	}
	if logs := r.logs.String(); strings.Contains(logs, secret) || !strings.Contains(logs, "credit delivery failed") {
		t.Errorf("the relay's log quotes the password, or does not report the failure:\n%s", logs)
	}

	tp.serve(m) // b is back
	if n := r.Pass(ctx); n != len(trs) {
		t.Errorf("Pass with b back settled %d credits, want %d", n, len(trs))
	}
	c.checkDelivered(m, trs)
	for id, rows := range c.census().owed {
		if rows[0].lastError != nil {
			t.Errorf("%s settled with last_error %q", id, *rows[0].lastError)
		}
	}
}

// dbNow is the test server's clock.
func dbNow(t *testing.T, c *cluster) time.Time {
	t.Helper()
	var now time.Time
	if err := c.pool(c.names[0]).QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&now); err != nil {
		t.Fatal(err)
	}
	return now
}

// A destination range that is moving (revoked on its shard, not granted anywhere) answers
// not_owner: its credits stay owed. Once the move is applied, the shard's newer map version
// makes the relay reload, and the credits go to the new owner, once.
func TestMovingDestinationIsNotOwner(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b", "c")
	v1 := c.mapOf(1, "a=-80 b=80- c=")
	c.apply(v1)
	src, dsts := accounts(t, "-80", 1)[0], accounts(t, "80-", 3)
	var trs []transfer
	for i, dst := range dsts {
		trs = append(trs, transfer{id: fmt.Sprintf("t-%d", i), src: src, dst: dst, amount: 10})
	}
	c.debit(v1, trs)

	v2 := c.mapOf(2, "a=-80 b= c=80-")
	if err := idem.ApplyOwnership(ctx, c.pool("b"), idem.Ownership{Shard: "b", MapVersion: 2}, idem.Revoke); err != nil {
		t.Fatal(err)
	}
	cfg := relayConfig(t)
	tp := newTopos(t, cfg, v1)
	r := newRelay(cfg, tp)
	if n := r.Pass(ctx); n != 0 {
		t.Fatalf("Pass settled %d credits into a moving range", n)
	}
	for id, o := range c.pending() {
		if o.lastError == nil || !strings.Contains(*o.lastError, "does not own dst") {
			t.Errorf("%s: last_error %v, want it to say b does not own dst", id, o.lastError)
		}
	}
	if got := r.deliveries(t, "b", "not_owner"); got != 3 || tp.reloads != 0 {
		t.Errorf("not_owner deliveries %v, reloads %d; want 3 and none (b still follows version 1)", got, tp.reloads)
	}

	c.apply(v2) // c owns 80- now
	tp.publish(v2)
	c.makeDue()
	if n := r.Pass(ctx); n != 0 || tp.version() != 2 || tp.reloads != 1 {
		t.Errorf("Pass after the move settled %d, relay map version %d after %d reloads; want 0, then version 2 after 1",
			n, tp.version(), tp.reloads)
	}
	c.makeDue()
	if n := r.Pass(ctx); n != len(trs) {
		t.Errorf("Pass with the new map settled %d credits, want %d", n, len(trs))
	}
	c.checkDelivered(v2, trs)
	if got := r.deliveries(t, "c", "settled"); got != 3 {
		t.Errorf("deliveries to c settled: %v, want 3", got)
	}
}

// Key ranges move while two relays pass in a loop: a source range holding owed credits (40-80,
// a → c → b) and a destination range (c0-, b → c → a), with more debits between the moves.
// Whatever the interleaving, each credit is applied once overall, on the final owner of dst,
// each owed-credit row ends settled, once, on the final owner of src, and nothing stays owed.
func TestRangeMovesWhileRelaying(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b", "c")
	v1 := c.mapOf(1, "a=-40,40-80 b=80-c0,c0- c=")
	v2 := c.mapOf(2, "a=-40 b=80-c0 c=40-80,c0-")
	v3 := c.mapOf(3, "a=-40,c0- b=40-80,80-c0 c=")
	c.apply(v1)
	var accts []int64
	for _, r := range []string{"-40", "40-80", "80-c0", "c0-"} {
		accts = append(accts, accounts(t, r, 4)...)
	}
	gen := &transferGen{c: c, accts: accts, rng: rand.New(rand.NewPCG(3, 4))}
	gen.more(v1, 300)
	trs := gen.trs
	// The credits owed from the ranges that move to c wait until they have moved, so that they
	// move holding them.
	var held []string
	for _, tr := range trs {
		if tr.owed && owner(v2, tr.src) == "c" {
			held = append(held, tr.id)
		}
	}
	c.postpone([]string{"a", "b"}, held)

	cfg := relayConfig(t, "batch: 8", "backoff_base: 10ms", "backoff_max: 50ms")
	tp := newTopos(t, cfg, v1)
	relays := []testRelay{newRelay(cfg, tp), newRelay(cfg, tp)}
	halt, settled := passInLoops(ctx, relays)
	defer halt() // if the test fails before the loops are stopped below
	c.apply(v2)
	moved := 0
	for id, o := range c.pending() {
		if o.shard == "c" && slices.Contains(held, id) {
			moved++
		}
	}
	if len(held) == 0 || moved != len(held) {
		t.Fatalf("%d of the %d credits owed from 40-80 and c0- are pending on c after they moved there", moved, len(held))
	}
	c.makeDue()
	tp.publish(v2) // the relays reload it when a shard says it is newer
	gen.more(v2, 100)
	c.apply(v3)
	tp.serve(v3)
	gen.more(v3, 50)
	trs = gen.trs
	// Let the loops deliver what they can by themselves (all but what their own leases hold),
	// until the owed count stops falling.
	for last := -1; ; time.Sleep(50 * time.Millisecond) {
		n := len(c.pending())
		if n == 0 || n == last {
			break
		}
		last = n
	}
	halt()
	t.Logf("while ranges moved the relays settled %d and %d credits; %d were owed when they stopped", settled[0], settled[1], len(c.pending()))

	c.redeliverLeased(relays[0])
	if p := c.pending(); len(p) > 0 {
		t.Errorf("%d credits still owed after the moves, e.g. %+v", len(p), p)
	}
	c.checkDelivered(v3, trs)
	var conflicts float64
	for _, r := range relays {
		for _, shard := range []string{"a", "b", "c"} {
			conflicts += r.deliveries(t, shard, "conflict")
		}
	}
	if conflicts != 0 {
		t.Errorf("%v credit deliveries met a different credit under their transfer id", conflicts)
	}
}

// Observe sets, per shard of the current map, the credits it owes and the age of the oldest;
// an unreachable shard keeps its last values, and a shard that left the map loses its series.
func TestObserveOwedGauges(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b", "c")
	v1 := c.mapOf(1, "a=-80 b=80- c=")
	c.apply(v1)
	low, high := accounts(t, "-80", 2), accounts(t, "80-", 2)
	trs := []transfer{
		{id: "t-1", src: low[0], dst: high[0], amount: 10},
		{id: "t-2", src: low[0], dst: high[1], amount: 10},
		{id: "t-3", src: low[1], dst: high[0], amount: 10},
		{id: "t-4", src: high[0], dst: low[0], amount: 10},
	}
	c.debit(v1, trs)
	if _, err := c.pool("a").Exec(ctx, "UPDATE shardgate_credit_outbox SET debited_at = now() - interval '90 seconds' WHERE transfer_id = 't-2'"); err != nil {
		t.Fatal(err)
	}
	cfg := relayConfig(t)
	tp := newTopos(t, cfg, v1)
	r := newRelay(cfg, tp)
	gauges := func() map[string][2]float64 {
		out := map[string][2]float64{}
		for _, shard := range []string{"a", "b", "c"} {
			owed, ok := r.metric(t, "shardgate_credits_owed", "shard", shard)
			age, _ := r.metric(t, "shardgate_credit_oldest_owed_age_seconds", "shard", shard)
			if ok {
				out[shard] = [2]float64{owed, age}
			}
		}
		return out
	}

	r.Observe(ctx)
	g := gauges()
	if g["a"][0] != 3 || g["a"][1] < 90 || g["a"][1] > 120 || g["b"][0] != 1 || g["b"][1] > 30 || g["c"] != [2]float64{} || len(g) != 3 {
		t.Errorf("owed, oldest age per shard: %v; want a 3 and 90s, b 1 and about 0, c 0 and 0", g)
	}
	r.Pass(ctx)
	r.Observe(ctx)
	if g := gauges(); g["a"] != [2]float64{} || g["b"] != [2]float64{} || len(g) != 3 {
		t.Errorf("owed, oldest age per shard once delivered: %v; want 0 and 0 for a, b and c", g)
	}

	v2 := c.mapOf(2, "a=-80 b=80-") // c removed
	c.apply(v2)
	tp.serve(v2)
	r.Observe(ctx)
	if g := gauges(); len(g) != 2 {
		t.Errorf("owed, oldest age per shard after c left the map: %v; want a and b only", g)
	}
	if n := r.series(t, "shardgate_credits_owed") + r.series(t, "shardgate_credit_oldest_owed_age_seconds"); n != 4 {
		t.Errorf("%d owed-credit gauge series, want 4", n)
	}

	c.debit(v2, []transfer{{id: "t-5", src: low[0], dst: high[0], amount: 10}})
	tp.serve(c.mapOf(2, "a=-80 b=80-", "a")) // a unreachable
	r.Observe(ctx)
	if g := gauges(); g["a"] != [2]float64{} {
		t.Errorf("a, unreachable, shows %v; want its last values, 0 and 0", g["a"])
	}
	tp.serve(v2)
	r.Observe(ctx)
	if g := gauges(); g["a"][0] != 1 {
		t.Errorf("a, reachable again, owes %v credits; want 1", g["a"][0])
	}
}

// A credit dst's shard refuses (here a check constraint only it has) fails alone: the others of
// its group are applied and settled, and it stays owed with the shard's error until fixed.
func TestRefusedCreditDoesNotHoldUpItsGroup(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b")
	m := c.mapOf(1, "a=-80 b=80-")
	c.apply(m)
	src, dst := accounts(t, "-80", 1)[0], accounts(t, "80-", 1)[0]
	trs := []transfer{
		{id: "t-refused", src: src, dst: dst, amount: 666},
		{id: "t-1", src: src, dst: dst, amount: 10},
		{id: "t-2", src: src, dst: dst, amount: 20},
	}
	for i := range trs {
		c.debit(m, trs[i:i+1]) // in this order: the refused credit comes first in the group
	}
	if _, err := c.pool("b").Exec(ctx, "ALTER TABLE ledger_entries ADD CONSTRAINT relay_test_refuses_666 CHECK (kind <> 'transfer_in' OR amount <> 666)"); err != nil {
		t.Fatal(err)
	}
	cfg := relayConfig(t)
	r := newRelay(cfg, newTopos(t, cfg, m))
	if n := r.Pass(ctx); n != 2 {
		t.Errorf("Pass settled %d credits, want the 2 that b accepts", n)
	}
	p := c.pending()
	if o, ok := p["t-refused"]; len(p) != 1 || !ok || o.lastError == nil || !strings.Contains(*o.lastError, "relay_test_refuses_666") {
		t.Errorf("pending %+v; want t-refused alone, its last_error naming the constraint", p)
	}
	if got := r.deliveries(t, "b", "error"); got != 1 {
		t.Errorf("failed deliveries: %v, want 1", got)
	}
	c.makeDue()
	if n := r.Pass(ctx); n != 0 || c.pending()["t-refused"].attempts != 2 || r.deliveries(t, "b", "error") != 2 {
		t.Errorf("Pass of the refused credit alone settled %d; want it refused again: %v", n, c.pending()["t-refused"])
	}

	if _, err := c.pool("b").Exec(ctx, "ALTER TABLE ledger_entries DROP CONSTRAINT relay_test_refuses_666"); err != nil {
		t.Fatal(err)
	}
	c.makeDue()
	if n := r.Pass(ctx); n != 1 {
		t.Errorf("Pass once b accepts it settled %d credits, want 1", n)
	}
	c.checkDelivered(m, trs)
}

// A different credit already holding the transfer id on dst's shard is a conflict: the credit
// stays owed, is counted and logged for reconciliation, and nothing is overwritten.
func TestConflictingCreditStaysOwed(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b")
	m := c.mapOf(1, "a=-80 b=80-")
	c.apply(m)
	tr := transfer{id: "t-1", src: accounts(t, "-80", 1)[0], dst: accounts(t, "80-", 1)[0], amount: 10}
	trs := []transfer{tr}
	c.debit(m, trs)
	other := owedCredit(tr)
	other.Amount = 11
	if res, err := idem.Transfer(ctx, c.pool("b"), idem.CreditRequest(other, shardmap.KeyspaceID(tr.dst), 720*time.Hour)); err != nil || res.Outcome != idem.Applied {
		t.Fatalf("the other credit: %v %v", res.Outcome, err)
	}
	cfg := relayConfig(t)
	r := newRelay(cfg, newTopos(t, cfg, m))
	if n := r.Pass(ctx); n != 0 {
		t.Errorf("Pass settled %d credits, want none", n)
	}
	if o, ok := c.pending()["t-1"]; !ok || o.lastError == nil || !strings.Contains(*o.lastError, "a different credit") {
		t.Errorf("t-1 pending %t, last_error %v; want it owed, saying a different credit holds the id", ok, o.lastError)
	}
	if got := r.deliveries(t, "b", "conflict"); got != 1 || !strings.Contains(r.logs.String(), "CREDIT CONFLICT") {
		t.Errorf("conflicts counted %v, logged %t; want 1 and logged", got, strings.Contains(r.logs.String(), "CREDIT CONFLICT"))
	}
	var amount int64
	if err := c.pool("b").QueryRow(ctx, "SELECT amount FROM ledger_entries WHERE transfer_id = 't-1' AND kind = 'transfer_in'").Scan(&amount); err != nil || amount != 11 {
		t.Errorf("credit on b: amount %d (%v), want the other credit's 11 untouched", amount, err)
	}
}

// Run passes on Notify, without waiting for its poll interval, and returns when its context ends.
func TestRunDeliversOnNotify(t *testing.T) {
	c := newCluster(t, "a", "b")
	m := c.mapOf(1, "a=-80 b=80-")
	c.apply(m)
	cfg := relayConfig(t, "poll_interval: 1h")
	r := newRelay(cfg, newTopos(t, cfg, m))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		r.Run(ctx)
		close(done)
	}()
	trs := []transfer{{id: "t-1", src: accounts(t, "-80", 1)[0], dst: accounts(t, "80-", 1)[0], amount: 10}}
	c.debit(m, trs)
	r.Notify()
	for deadline := time.Now().Add(10 * time.Second); len(c.pending()) > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return once its context ended")
	}
	c.checkDelivered(m, trs)
}

// transferGen makes random transfers between accts and debits them.
type transferGen struct {
	c     *cluster
	accts []int64
	rng   *rand.Rand
	trs   []transfer // every transfer made so far
}

// more debits n new transfers routed by m.
func (g *transferGen) more(m *shardmap.Map, n int) {
	batch := make([]transfer, 0, n)
	for len(batch) < n {
		src, dst := g.accts[g.rng.IntN(len(g.accts))], g.accts[g.rng.IntN(len(g.accts))]
		if src != dst {
			batch = append(batch, transfer{id: fmt.Sprintf("t-%03d", len(g.trs)+len(batch)), src: src, dst: dst, amount: int64(1 + g.rng.IntN(1000))})
		}
	}
	g.c.debit(m, batch)
	g.trs = append(g.trs, batch...)
}

// passInLoops runs Pass of each relay in a loop of its own until halt is called, and counts
// what each settled (read it after halt).
func passInLoops(ctx context.Context, relays []testRelay) (halt func(), settled []int) {
	loopCtx, stop := context.WithCancel(ctx)
	settled = make([]int, len(relays))
	var wg sync.WaitGroup
	for i, r := range relays {
		wg.Go(func() {
			for loopCtx.Err() == nil {
				settled[i] += r.Pass(loopCtx)
			}
		})
	}
	return func() {
		stop()
		wg.Wait()
	}, settled
}

// redeliverLeased delivers with r what the leases of stopped relays still hold (claimed when
// they stopped, or delivered to a shard that gave dst's range away before the relay read the
// credit back): it replays.
func (c *cluster) redeliverLeased(r testRelay) {
	for i := 0; i < 5 && len(c.pending()) > 0; i++ {
		c.expireLeases()
		c.makeDue()
		r.Pass(context.Background())
	}
}

// postpone makes the owed credits ids on shards due only in an hour.
func (c *cluster) postpone(shards, ids []string) {
	for _, shard := range shards {
		if _, err := c.pool(shard).Exec(context.Background(), "UPDATE shardgate_credit_outbox SET next_attempt_at = now() + interval '1 hour' WHERE transfer_id = ANY($1)", ids); err != nil {
			c.t.Fatal(err)
		}
	}
}

// Each settled credit's time from its debit to its credit is observed once, on dst's shard's
// series, as the two ledgers record it: no credit of a debit written at least 100 ms before the
// pass is seen faster, and none slower than the time the test took.
func TestCreditDelayIsObserved(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "a", "b")
	m := c.mapOf(1, "a=-80 b=80-")
	c.apply(m)
	start := dbNow(t, c)
	trs := pairs(append(accounts(t, "-80", 2), accounts(t, "80-", 3)...))
	c.debit(m, trs)
	time.Sleep(100 * time.Millisecond)
	cfg := relayConfig(t)
	r := newRelay(cfg, newTopos(t, cfg, m))
	if n := r.Pass(ctx); n != 12 {
		t.Fatalf("Pass settled %d credits, want 12", n)
	}
	took := dbNow(t, c).Sub(start).Seconds()
	families, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "shardgate_credit_delay_seconds" {
			continue
		}
		for _, s := range f.GetMetric() {
			h, shard := s.GetHistogram(), s.GetLabel()[0].GetValue()
			got[shard] = h.GetSampleCount()
			if h.GetSampleSum() > float64(h.GetSampleCount())*took {
				t.Errorf("credits to %s took %.3f s in all, more than %d × the test's %.3f s", shard, h.GetSampleSum(), h.GetSampleCount(), took)
			}
			for _, b := range h.GetBucket() {
				if b.GetUpperBound() < 0.1 && b.GetCumulativeCount() != 0 {
					t.Errorf("credits to %s: %d observed within %v s of their debit, want none under 0.1 s", shard, b.GetCumulativeCount(), b.GetUpperBound())
				}
			}
		}
	}
	if want := map[string]uint64{"a": 6, "b": 6}; !maps.Equal(got, want) {
		t.Errorf("credit delays observed per destination shard: %v, want %v", got, want)
	}
	if n := r.Pass(ctx); n != 0 {
		t.Errorf("a second Pass settled %d credits, want none", n)
	}
}
