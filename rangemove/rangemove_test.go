package rangemove

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/pgtest"
	"github.com/shardgate/shardgate/internal/pgtest/shardtest"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/shardmap"
)

// cluster is a set of shards, each a database of the test server, and the maps applied to it.
type cluster struct {
	t     *testing.T
	pools shardtest.Pools
}

func newCluster(t *testing.T, names ...string) *cluster {
	return &cluster{t: t, pools: shardtest.New(t, names...)}
}

func (c *cluster) pool(name string) *pgxpool.Pool { return c.pools[name] }

// mapOf parses a map of version v; owners is as testkit.ShardMap's (an empty range list drains
// the shard).
func (c *cluster) mapOf(v int64, owners string) *shardmap.Map {
	c.t.Helper()
	return testkit.ShardMap(c.t, v, owners, testkit.UnusedDSN)
}

func (c *cluster) apply(m *shardmap.Map) ([]MoveReport, error) {
	return ApplyMap(context.Background(), m, c.pool, partition.Daily)
}

func (c *cluster) mustApply(m *shardmap.Map) []MoveReport {
	c.t.Helper()
	moves, err := c.apply(m)
	if err != nil {
		c.t.Fatalf("apply version %d: %v", m.Version, err)
	}
	return moves
}

// owned returns what shard owns, as "active | moving" range strings.
func (c *cluster) owned(shard string) string {
	c.t.Helper()
	o, err := idem.ReadOwnership(context.Background(), c.pool(shard))
	if err != nil {
		c.t.Fatal(err)
	}
	return fmt.Sprintf("%v | %v", o.Ranges, o.Moving)
}

// rows returns the debits and idempotency records a shard holds.
func (c *cluster) rows(shard string) (ledger, records int) {
	c.t.Helper()
	err := c.pool(shard).QueryRow(context.Background(),
		"SELECT (SELECT count(*) FROM ledger_entries WHERE kind = 'transfer_out'), (SELECT count(*) FROM idempotency_record)").Scan(&ledger, &records)
	if err != nil {
		c.t.Fatal(err)
	}
	return ledger, records
}

// transferAt applies a transfer with keyspace id 42 (in "-80") on shard and checks it applied.
func (c *cluster) transferAt(shard, key string) {
	c.t.Helper()
	res, err := idem.Transfer(context.Background(), c.pool(shard), testTransfer(key, 100))
	if err != nil || res.Outcome != idem.Applied {
		c.t.Fatalf("transfer %s on %s: %v %v", key, shard, res.Outcome, err)
	}
}

func TestApplyMapRefusesWhileAnotherRuns(t *testing.T) {
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=- sb="))

	// Another apply holds sb's lock.
	ctx := context.Background()
	other, err := c.pool("sb").Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	if _, err := other.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", idem.LockClass, idem.LockApply); err != nil {
		t.Fatal(err)
	}
	_, err = c.apply(c.mapOf(2, "sa=80- sb=-80"))
	if !errors.Is(err, ErrApplyRunning) || !strings.Contains(err.Error(), "shard sb") {
		t.Fatalf("apply during another: %v, want ErrApplyRunning naming shard sb", err)
	}
	if got := c.owned("sa"); got != "[-] | []" {
		t.Errorf("sa owns %s after a refused apply, want it untouched", got)
	}
	// sa's lock was given back: once the other apply ends, this one runs.
	if _, err := other.Exec(ctx, "SELECT pg_advisory_unlock($1, $2)", idem.LockClass, idem.LockApply); err != nil {
		t.Fatal(err)
	}
	c.mustApply(c.mapOf(2, "sa=80- sb=-80"))
	if got := c.owned("sb"); got != "[-80] | []" {
		t.Errorf("sb owns %s, want [-80]", got)
	}
}

// revoke runs the revoke phase of m on the named shards only: an apply that stopped there.
func (c *cluster) revoke(m *shardmap.Map, shards ...string) {
	c.t.Helper()
	c.phase(m, idem.Revoke, shards...)
}

func (c *cluster) phase(m *shardmap.Map, p idem.Phase, shards ...string) {
	c.t.Helper()
	for _, name := range shards {
		o := idem.Ownership{Shard: name, MapVersion: m.Version, Ranges: m.Ownership()[name]}
		if err := idem.ApplyOwnership(context.Background(), c.pool(name), o, p); err != nil {
			c.t.Fatal(err)
		}
	}
}

// grantedNotSettled runs m's revoke on every shard of m, copies r from one shard to another,
// and grants m on every shard: an apply that stopped before its settle.
func (c *cluster) grantedNotSettled(m *shardmap.Map, r, from, to string) {
	c.t.Helper()
	var names []string
	for _, s := range m.Shards {
		names = append(names, s.Name)
	}
	c.revoke(m, names...)
	kr, err := shardmap.ParseKeyRange(r)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := copyRange(context.Background(), c.pool(from), c.pool(to), kr, partition.Daily, &MoveReport{}); err != nil {
		c.t.Fatal(err)
	}
	c.phase(m, idem.Grant, names...)
}

// An apply of version 9 began (its revoke ran on sc) and stopped; version 8 must not be applied
// over it, or the two maps' owners of -80 could both be active. It is refused before it revokes
// anything, so no range is left without an owner.
func TestApplyMapRefusesOlderMapAfterNewerBegan(t *testing.T) {
	c := newCluster(t, "sa", "sb", "sc")
	c.mustApply(c.mapOf(7, "sa=- sb= sc="))
	v9 := c.mapOf(9, "sa=80- sb= sc=-80")
	c.revoke(v9, "sc")
	_, err := c.apply(c.mapOf(8, "sa=80- sb=-80 sc="))
	if !errors.Is(err, idem.ErrOlderMap) || !strings.Contains(err.Error(), "version 9") {
		t.Fatalf("apply of version 8 after 9 began: %v, want idem.ErrOlderMap naming version 9", err)
	}
	if got := c.owned("sa"); got != "[-] | []" {
		t.Errorf("sa owns %s after the refused older map, want [-] untouched", got)
	}
	// Once it has begun on every shard, each refuses the older map's phases by itself too.
	c.revoke(v9, "sa", "sb")
	o := idem.Ownership{Shard: "sb", MapVersion: 8, Ranges: c.mapOf(8, "sa=80- sb=-80 sc=").Ownership()["sb"]}
	if err := idem.ApplyOwnership(context.Background(), c.pool("sb"), o, idem.Grant); !errors.Is(err, idem.ErrOlderMap) {
		t.Fatalf("grant of version 8 on sb after 9's revoke: %v, want idem.ErrOlderMap", err)
	}
	if got := c.owned("sb"); !strings.HasPrefix(got, "[] |") {
		t.Errorf("sb owns %s; nothing may be granted by the older map", got)
	}
	// Finishing version 9 works and makes sc the one owner of -80.
	c.mustApply(v9)
	for shard, want := range map[string]string{"sa": "[80-] | []", "sb": "[] | []", "sc": "[-80] | []"} {
		if got := c.owned(shard); got != want {
			t.Errorf("%s owns %s, want %s", shard, got, want)
		}
	}
}

// An apply that stopped before its grant must be finished, by applying its map again, before
// another map is applied; one that stopped after its grant does not count its moving ranges as
// held (they stood in for a shard missing from the next map, and a key applied on two shards).
// Each case stops version 2 (sb gets -80 from sa) at another point, then offers a version 3 that
// must be refused.
func TestStoppedApplyMustFinishFirst(t *testing.T) {
	ctx := context.Background()
	low, _ := shardmap.ParseKeyRange("-80")
	v2 := func(c *cluster) *shardmap.Map { return c.mapOf(2, "sa=80- sb=-80 sc=") }
	copyLow := func(t *testing.T, c *cluster) {
		mv := MoveReport{}
		if err := copyRange(ctx, c.pool("sa"), c.pool("sb"), low, partition.Daily, &mv); err != nil || mv.Records != 1 {
			t.Fatalf("copy: %v, %d records", err, mv.Records)
		}
	}
	unfinished := func(err error) bool {
		return errors.Is(err, ErrUnfinishedApply) && strings.Contains(err.Error(), "version 2")
	}
	unheld := func(err error) bool { return err != nil && strings.Contains(err.Error(), "held by no shard") }
	cases := []struct {
		name    string
		stop    func(t *testing.T, c *cluster) // runs part of version 2
		next    string                         // version 3, which must be refused
		refused func(error) bool
	}{
		{"after revoke, map back", func(t *testing.T, c *cluster) { c.revoke(v2(c), "sa", "sb", "sc") }, "sa=- sb= sc=", unfinished},
		{"after copy, source left out", func(t *testing.T, c *cluster) {
			c.revoke(v2(c), "sa", "sb", "sc")
			copyLow(t, c)
		}, "sb=- sc=", func(err error) bool { return unfinished(err) || unheld(err) }},
		{"after grant, new owner left out", func(t *testing.T, c *cluster) {
			c.grantedNotSettled(v2(c), "-80", "sa", "sb")
			c.transferAt("sb", "k2") // acknowledged by the new owner
		}, "sa=80- sc=-80", unheld},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, "sa", "sb", "sc")
			c.mustApply(c.mapOf(1, "sa=- sb= sc="))
			c.transferAt("sa", "k1")
			tc.stop(t, c)
			before := map[string]string{}
			for _, sh := range []string{"sa", "sb", "sc"} {
				before[sh] = c.owned(sh)
			}
			if _, err := c.apply(c.mapOf(3, tc.next)); !tc.refused(err) {
				t.Fatalf("apply of version 3 (%s): %v, want it refused", tc.next, err)
			}
			for sh, want := range before {
				if got := c.owned(sh); got != want {
					t.Errorf("%s owns %s after the refusal, want %s unchanged", sh, got, want)
				}
			}
			// Finishing version 2, then version 3, works, and leaves every row once.
			c.mustApply(v2(c))
			c.mustApply(c.mapOf(3, "sa=- sb= sc="))
			if l, r := c.rows("sb"); l != 0 || r != 0 {
				t.Errorf("sb kept %d ledger rows and %d records after the range went back to sa", l, r)
			}
			res, err := idem.Transfer(ctx, c.pool("sa"), testTransfer("k1", 100))
			if err != nil || res.Outcome != idem.Replayed {
				t.Errorf("retry of k1 on sa: %v %v, want replayed", res.Outcome, err)
			}
		})
	}
}

// An apply granted everywhere but not settled is settled by the next map, which then proceeds:
// whether that map keeps every shard, or leaves out one the stopped apply drained.
func TestNextMapSettlesGrantedApply(t *testing.T) {
	ctx := context.Background()
	t.Run("all shards kept", func(t *testing.T) {
		c := newCluster(t, "sa", "sb")
		c.mustApply(c.mapOf(1, "sa=- sb="))
		c.transferAt("sa", "k1")
		c.grantedNotSettled(c.mapOf(2, "sa=80- sb=-80"), "-80", "sa", "sb")
		c.mustApply(c.mapOf(3, "sa=- sb="))
		if l, r := c.rows("sb"); l != 0 || r != 0 {
			t.Errorf("sb kept %d ledger rows and %d records", l, r)
		}
		if l, r := c.rows("sa"); l != 1 || r != 1 {
			t.Errorf("sa holds %d ledger rows and %d records, want 1 and 1", l, r)
		}
	})
	t.Run("drained shard left out, then added back", func(t *testing.T) {
		c := newCluster(t, "sa", "sb")
		c.mustApply(c.mapOf(1, "sa=80- sb=-80"))
		c.transferAt("sb", "k1")
		// Version 2 drains sb, and its settle stops before reaching sb.
		v2 := c.mapOf(2, "sa=- sb=")
		c.grantedNotSettled(v2, "-80", "sb", "sa")
		c.phase(v2, idem.Settle, "sa")
		c.mustApply(c.mapOf(3, "sa=-")) // sb removed: nothing here can see it
		c.mustApply(c.mapOf(4, "sa=- sb="))
		if l, r := c.rows("sb"); l != 0 || r != 0 {
			t.Errorf("sb kept %d ledger rows and %d records of its drained range", l, r)
		}
		if got := c.owned("sb"); got != "[] | []" {
			t.Errorf("sb owns %s, want nothing", got)
		}
		res, err := idem.Transfer(ctx, c.pool("sa"), testTransfer("k1", 100))
		if err != nil || res.Outcome != idem.Replayed {
			t.Errorf("retry of k1 on sa: %v %v, want replayed", res.Outcome, err)
		}
	})
}

// A drain that stopped before the drained shard's grant does not strand it: every range it gave
// up is active elsewhere, so a newer map settles it, whether it keeps the shard or the shard is
// left out and added back later.
func TestDrainStoppedBeforeItsGrant(t *testing.T) {
	ctx := context.Background()
	for _, leftOut := range []bool{false, true} {
		t.Run(fmt.Sprintf("left out %t", leftOut), func(t *testing.T) {
			c := newCluster(t, "sa", "sb", "sx")
			c.mustApply(c.mapOf(1, "sa=80- sb= sx=-80"))
			c.transferAt("sx", "k1")
			v2 := c.mapOf(2, "sa=80- sb=-80 sx=")
			c.revoke(v2, "sa", "sb", "sx")
			low, _ := shardmap.ParseKeyRange("-80")
			if err := copyRange(ctx, c.pool("sx"), c.pool("sb"), low, partition.Daily, &MoveReport{}); err != nil {
				t.Fatal(err)
			}
			c.phase(v2, idem.Grant, "sa", "sb") // stops before sx
			if leftOut {
				c.mustApply(c.mapOf(3, "sa=80- sb=-80"))
			}
			c.mustApply(c.mapOf(4, "sa=80- sb=-80 sx="))
			if l, r := c.rows("sx"); l != 0 || r != 0 {
				t.Errorf("sx kept %d ledger rows and %d records", l, r)
			}
			if got := c.owned("sx"); got != "[] | []" {
				t.Errorf("sx owns %s, want nothing", got)
			}
			res, err := idem.Transfer(ctx, c.pool("sb"), testTransfer("k1", 100))
			if err != nil || res.Outcome != idem.Replayed {
				t.Errorf("retry of k1 on sb: %v %v, want replayed", res.Outcome, err)
			}
		})
	}
}

// A new shard that a stopped apply copied rows to, and did not grant, is no fresh database and
// no drain: a map of it alone must not be taken as a new cluster, nor its copies settled away.
func TestStoppedCopyDestinationIsNotANewCluster(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "sa", "sn")
	c.mustApply(c.mapOf(1, "sa=-"))
	c.transferAt("sa", "k1")
	v2 := c.mapOf(2, "sa= sn=-")
	c.revoke(v2, "sa", "sn")
	all, _ := shardmap.ParseKeyRange("-")
	if err := copyRange(ctx, c.pool("sa"), c.pool("sn"), all, partition.Daily, &MoveReport{}); err != nil {
		t.Fatal(err)
	}
	c.phase(v2, idem.Grant, "sa") // stops before sn
	if _, err := c.apply(c.mapOf(3, "sn=-")); err == nil {
		t.Fatal("a map of only the stopped apply's destination was accepted")
	}
	if l, r := c.rows("sn"); l != 1 || r != 1 {
		t.Errorf("sn holds %d ledger rows and %d records, want its copy (1 and 1) kept", l, r)
	}
	c.mustApply(v2)
	res, err := idem.Transfer(ctx, c.pool("sn"), testTransfer("k1", 100))
	if err != nil || res.Outcome != idem.Replayed {
		t.Errorf("retry of k1 on sn: %v %v, want replayed", res.Outcome, err)
	}
}

// The same version with another map is refused, even when the shard it changes is left out of
// the new map: version 2 stopped after its grant (sb acknowledged k2), then an edited version 2
// gives -80 to sd, a shard new to the cluster, instead of sb.
func TestSameVersionOtherMapRefused(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "sa", "sb", "sc", "sd")
	c.mustApply(c.mapOf(1, "sa=- sb= sc="))
	c.transferAt("sa", "k1")
	v2 := c.mapOf(2, "sa=80- sb=-80 sc=")
	c.grantedNotSettled(v2, "-80", "sa", "sb")
	c.transferAt("sb", "k2")
	// The phases above ran without a digest; ApplyMap's own would store one. Store it as the
	// apply of v2 would have.
	if _, err := c.pool("sa").Exec(ctx, "UPDATE shardgate_shard SET applying_digest = $1", MapDigest(v2)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.apply(c.mapOf(2, "sa=80- sc= sd=-80")); !errors.Is(err, idem.ErrChangedMap) {
		t.Fatalf("edited version 2: %v, want idem.ErrChangedMap", err)
	}
	if got := c.owned("sd"); got != "[] | []" {
		t.Errorf("sd owns %s, want nothing", got)
	}
	c.mustApply(v2) // the real version 2 still finishes
}

// A map changed under a version a shard already follows is refused before any shard is
// revoked, or the shards revoked first would leave their ranges without an owner.
func TestApplyMapRefusesChangedMapBeforeRevoking(t *testing.T) {
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
	v2 := c.mapOf(2, "sa=-80 sb=80-")
	c.revoke(v2, "sa", "sb")
	c.phase(v2, idem.Grant, "sa")
	_, err := c.apply(c.mapOf(2, "sb=40- sa=-40"))
	if !errors.Is(err, idem.ErrChangedMap) {
		t.Fatalf("apply of a changed version 2: %v, want idem.ErrChangedMap", err)
	}
	if got := c.owned("sb"); got != "[80-] | []" {
		t.Errorf("sb owns %s, want [80-] untouched", got)
	}
	c.mustApply(v2) // the real version 2 still finishes
}

// Two shard names whose DSNs reach one database: the apply says so, not "another apply runs".
func TestApplyMapNamesSharedDatabase(t *testing.T) {
	c := newCluster(t, "sa")
	c.pools["sb"] = c.pools["sa"]
	_, err := c.apply(c.mapOf(1, "sa=-80 sb=80-"))
	if err == nil || !strings.Contains(err.Error(), "shard sb: its DSN reaches the database of shard sa") {
		t.Fatalf("apply: %v, want it to name the shared database", err)
	}
}

// A copy into a shard that meanwhile runs a transfer with the same key (reused for an account
// of that shard) must not leave two records of the key there.
func TestCopyTakesKeyLocks(t *testing.T) {
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
	c.transferAt("sa", "k1")
	c.revoke(c.mapOf(2, "sa= sb=-"), "sa", "sb")

	// On sb, a transfer of key k1 for a request of its own is in flight: it holds the key's
	// lock and has written its record, not yet committed.
	ctx := context.Background()
	tx, err := c.pool("sb").Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	req := testTransfer("k1", 999)
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1 || E'\\n' || $2, 1))", req.Scope, req.Key); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, response, state)
		VALUES ($1, $2, $3, 0, '{}', 'completed')`, req.Key, req.Scope, req.RequestHash); err != nil {
		t.Fatal(err)
	}

	low, _ := shardmap.ParseKeyRange("-80")
	done := make(chan error, 1)
	mv := MoveReport{}
	go func() { done <- copyRange(ctx, c.pool("sa"), c.pool("sb"), low, partition.Daily, &mv) }()
	select {
	case err := <-done:
		t.Fatalf("the copy finished (%v) while the key's transfer held its lock", err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c.pool("sb").QueryRow(ctx, "SELECT count(*) FROM idempotency_record WHERE key = 'k1'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 || mv.Records != 0 || mv.Conflicts != 1 {
		t.Errorf("sb holds %d records of k1; copy inserted %d with %d conflicts; want 1, 0 and 1", n, mv.Records, mv.Conflicts)
	}
}

// Copies run in batches; every record of a range larger than a batch arrives, once.
func TestCopyRangeInBatches(t *testing.T) {
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=- sb="))
	ctx := context.Background()
	const n = copyBatch*2 + 17
	for i := range n {
		r := testTransfer(fmt.Sprintf("key-%04d", i), 100)
		r.TransferID = fmt.Sprintf("t-%d", i)
		if res, err := idem.Transfer(ctx, c.pool("sa"), r); err != nil || res.Outcome != idem.Applied {
			t.Fatalf("transfer %d: %v %v", i, res.Outcome, err)
		}
	}
	moves := c.mustApply(c.mapOf(2, "sa=80- sb=-80"))
	if len(moves) != 1 || moves[0].Records != n || moves[0].Ledger != n {
		t.Fatalf("moves %+v, want one of %d records and ledger rows", moves, n)
	}
	if l, r := c.rows("sb"); l != n || r != n {
		t.Errorf("sb holds %d ledger rows and %d records, want %d", l, r, n)
	}
	if l, r := c.rows("sa"); l != 0 || r != 0 {
		t.Errorf("sa kept %d ledger rows and %d records of the moved range", l, r)
	}
}

// owedRow is an owed-credit row as a shard holds it.
type owedRow struct {
	settledAt   *time.Time
	attempts    int
	nextAttempt time.Time
	leaseOwner  *string
}

// outbox returns the owed-credit rows shard holds, by transfer id.
func (c *cluster) outbox(shard string) map[string]owedRow {
	c.t.Helper()
	rows, _ := c.pool(shard).Query(context.Background(), "SELECT transfer_id, settled_at, attempts, next_attempt_at, lease_owner FROM shardgate_credit_outbox")
	out := map[string]owedRow{}
	var (
		id string
		o  owedRow
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &o.settledAt, &o.attempts, &o.nextAttempt, &o.leaseOwner}, func() error {
		out[id] = o
		return nil
	}); err != nil {
		c.t.Fatal(err)
	}
	return out
}

// Owed credits move with their debits' range: Plan counts them, the copy keeps each as it was
// (settled at its time, or pending with its attempts, due time and lease), the moved-away rows
// stay until the settle lists them to purge, and the new owner then delivers the pending ones.
func TestOwedCreditsMoveWithTheirSourceRange(t *testing.T) {
	ctx := context.Background()
	c := newCluster(t, "sa", "sb")
	c.mustApply(c.mapOf(1, "sa=-80 sb=80-"))
	for _, k := range []string{"k1", "k2", "k3"} {
		c.transferAt("sa", k) // to an account in 80-, on sb: the credit is owed
	}
	// t-k1 was delivered; t-k2 failed once and waits out its backoff; t-k3 is leased by a relay.
	settledAt := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	if err := idem.SettleCredits(ctx, c.pool("sa"), map[string]time.Time{"t-k1": settledAt}); err != nil {
		t.Fatal(err)
	}
	if claimed, err := idem.ClaimCredits(ctx, c.pool("sa"), "relay-x", 10, time.Hour); err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %d credits, %v; want t-k2 and t-k3", len(claimed), err)
	}
	if err := idem.DeferCredits(ctx, c.pool("sa"), "relay-x", []string{"t-k2"}, "dst down", idem.Backoff{Base: time.Hour, Max: time.Hour}); err != nil {
		t.Fatal(err)
	}
	before := c.outbox("sa")

	v2 := c.mapOf(2, "sa= sb=-80,80-")
	plan, err := Plan(ctx, v2, c.pool)
	if err != nil || len(plan) != 1 || plan[0].From != "sa" || plan[0].To != "sb" || plan[0].Credits != 3 || plan[0].Ledger != 3 {
		t.Fatalf("plan: %+v, %v; want one move sa → sb of 3 debits and 3 owed credits", plan, err)
	}
	c.revoke(v2, "sa", "sb")
	low, _ := shardmap.ParseKeyRange("-80")
	mv := MoveReport{}
	if err := copyRange(ctx, c.pool("sa"), c.pool("sb"), low, partition.Daily, &mv); err != nil || mv.Credits != 3 {
		t.Fatalf("copy: %v, %d owed credits copied; want 3", err, mv.Credits)
	}
	c.phase(v2, idem.Grant, "sa", "sb")
	if n := len(c.outbox("sa")); n != 3 {
		t.Errorf("sa holds %d owed credits between grant and settle, want its 3 until the settle", n)
	}
	c.phase(v2, idem.Settle, "sa", "sb")
	if _, err := idem.PurgeMoved(ctx, c.pool("sa"), 2, 0); err != nil {
		t.Fatal(err)
	}
	if n := len(c.outbox("sa")); n != 0 {
		t.Errorf("sa kept %d owed credits of the range it gave away", n)
	}

	after := c.outbox("sb")
	if len(after) != 3 {
		t.Fatalf("sb holds %d owed credits, want 3", len(after))
	}
	if at := after["t-k1"].settledAt; at == nil || !at.Equal(settledAt) {
		t.Errorf("t-k1 on sb settled at %v, want %v as on sa", at, settledAt)
	}
	for _, id := range []string{"t-k2", "t-k3"} {
		got, was := after[id], before[id]
		if got.settledAt != nil || got.attempts != was.attempts || !got.nextAttempt.Equal(was.nextAttempt) || !sameLease(got.leaseOwner, was.leaseOwner) {
			t.Errorf("%s on sb: settled %v, %d attempts, due %v, lease %v; want pending, %d attempts, due %v, lease %v as on sa",
				id, got.settledAt, got.attempts, got.nextAttempt, got.leaseOwner, was.attempts, was.nextAttempt, was.leaseOwner)
		}
	}
	// t-k3's lease moved with it: sb's relay leaves it to relay-x until the lease runs out, then
	// takes it over; t-k2 waits out its backoff.
	if claimed, err := idem.ClaimCredits(ctx, c.pool("sb"), "relay-y", 10, time.Minute); err != nil || len(claimed) != 0 {
		t.Errorf("claim on sb while relay-x's lease runs: %+v, %v; want nothing", claimed, err)
	}
	if _, err := c.pool("sb").Exec(ctx, "UPDATE shardgate_credit_outbox SET lease_until = now() - interval '1 second' WHERE transfer_id = 't-k3'"); err != nil {
		t.Fatal(err)
	}
	claimed, err := idem.ClaimCredits(ctx, c.pool("sb"), "relay-y", 10, time.Minute)
	if err != nil || len(claimed) != 1 || claimed[0].TransferID != "t-k3" || !claimed[0].TakenOver {
		t.Errorf("claim on sb: %+v, %v; want t-k3 alone, taken over from relay-x", claimed, err)
	}
}

func sameLease(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testTransfer is a transfer attempt of key with keyspace id 42 (in "-80"), to an account in
// "80-": its credit is owed unless its shard owns both.
func testTransfer(key string, amount int64) idem.TransferRequest {
	return idem.TransferRequest{
		Scope: "client-a:transfer", Key: key, RequestHash: fmt.Sprintf("hash-%d", amount),
		KeyspaceID: 42, DstKeyspaceID: 0x9000000000000000, TransferID: "t-" + key, Client: "client-a",
		Src: 1, Dst: 2, Amount: amount, Currency: "EUR", Retention: 720 * time.Hour,
		Response: idem.Response{Status: 201, Headers: map[string]string{"Content-Type": "application/json"}, Body: fmt.Sprintf(`{"key":%q}`, key)},
	}
}
