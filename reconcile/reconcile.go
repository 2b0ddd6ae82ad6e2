// Package reconcile checks that the ledgers of the shards of a shard map add up (Run, read-only):
// every debit has its credit, no credit exists without its debit, the two legs of a transfer
// agree, no leg exists twice anywhere, and per currency the debits equal the credits plus the
// credits still owed. It is `router reconcile` and the periodic check of `router serve`; Repair
// is `router reconcile --repair`.
//
// What is read. Every ledger row and owed-credit row of every shard, wherever its keyspace id
// lies, so that a row under a foreign keyspace id is found on the shard where it actually is.
// Only rows of a shard's inactive ranges (moving away, or copied ahead of a grant) are left
// out: they are copies that the settle of an apply deletes, counted on their owner. Every shard
// must follow the map it is checked against, with no apply in flight (an apply moves rows under
// the check): otherwise Run fails with ErrUnsettled.
//
// What is judged, per transfer id. A debit whose owed-credit row is not settled is pending. A
// debit without its credit is a missing credit at once, whatever its age, when its owed-credit
// row says settled or when it has no owed-credit row at all: nothing would ever deliver it. A
// credit without its debit, a credit that differs from its debit, and a second copy of a leg
// are discrepancies too, each named with the shard the row is on.
//
// One moment across shards. Each shard is read in its own READ ONLY, REPEATABLE READ
// transaction. Before any is read, every shard's clock is read twice over: first t0 of every
// shard, then t1 of every shard. Credits written before their shard's t0 and debits written
// before their shard's t1 are counted, nothing younger. A credit is delivered only after its
// debit committed, so the debit of a counted credit is counted too. Row times are only ever
// compared with their own shard's clock. What still looks missing or unpaired after the scan (a
// row whose transaction began before the cut but committed after its shard's snapshot) is read
// again, by transfer id, on every shard before it is reported.
//
// Memory. Each shard streams its rows in transfer id order, all shards at once, and the streams
// are merged, so one transfer's rows are judged together and then dropped: the check holds a
// row per shard, totals per currency, the MaxListed oldest discrepancies of each kind, and the
// legs left unpaired until they are read again: the missing credits (all of them: Repair needs
// every one) and the credits without debit. A shard's snapshot is held for as long
// as its rows take to stream, which holds back vacuum there meanwhile.
//
// The window. Options.Window limits the check to the transfers debited in the window before the
// check, read through indexes on the rows' times, so that it can run every few minutes.
// Credits are read from creditMargin earlier, so that a debit near the window's start finds its
// credit whatever the two shards' clocks say; such an early credit whose debit is not in the
// window is not the window's, and is left out.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/shardmap"
)

// MaxListed is how many discrepancies of each kind a Report keeps (the oldest); the others are
// only counted.
const MaxListed = 20

// creditMargin is how much earlier than a window's start credits are read: a credit is written
// after its debit, but by another shard's clock, which may be behind.
const creditMargin = 10 * time.Minute

// ErrUnsettled means a shard does not follow the shard map being checked, or is in the middle
// of applying one: rows may then be counted twice or not at all, so nothing is concluded.
var ErrUnsettled = errors.New("shard ownership does not match the shard map")

// Options are the settings of one check.
type Options struct {
	// Window limits the check to transfers debited less than Window before it began, by each
	// shard's clock (and their credits). Zero checks the whole history.
	Window time.Duration
}

// ShardError is a failure on one shard. Its message names the shard and is scrubbed of the
// shard's passwords: a driver's error may quote its connection settings.
type ShardError struct {
	Shard string
	Err   error
	text  string // Err's message, scrubbed
}

// Error is "shard NAME: " and the shard's error, scrubbed.
func (e *ShardError) Error() string { return "shard " + e.Shard + ": " + e.text }

// Unwrap returns the error of the shard, for errors.Is and errors.As.
func (e *ShardError) Unwrap() error { return e.Err }

func shardError(s shardmap.Shard, err error) error {
	return &ShardError{Shard: s.Name, Err: err, text: s.Scrub(err.Error())}
}

// Run checks the ledgers of every shard of m, reached through pool (a pool per shard name, as
// topology.Topology.Pool gives), and reports what it found. An error means the check could not
// be made; discrepancies are not errors (see Report.Clean). It never writes.
func Run(ctx context.Context, m *shardmap.Map, pool func(shard string) *pgxpool.Pool, opts Options) (Report, error) {
	if opts.Window < 0 {
		return Report{}, fmt.Errorf("reconcile: Window is %s; it must be 0 (the whole history) or more", opts.Window)
	}
	pools := make([]*pgxpool.Pool, len(m.Shards))
	for i, s := range m.Shards {
		if pools[i] = pool(s.Name); pools[i] == nil {
			return Report{}, fmt.Errorf("shard %s: no connection pool was opened for it", s.Name)
		}
	}
	clocks, err := readClocks(ctx, m, pools)
	if err != nil {
		return Report{}, err
	}
	t := newTally(m, opts.Window)
	if err := t.scan(ctx, m, pools, clocks, opts.Window); err != nil {
		return Report{}, err
	}
	if err := t.recheck(ctx, m, pools); err != nil {
		return Report{}, err
	}
	return t.report(clocks[0].t0, opts.Window), nil
}

// clock is what was read of one shard before any shard was scanned: t0 and t1 as the package
// doc has them.
type clock struct{ t0, t1 time.Time }

// readClocks reads t0 of every shard, then t1 of every shard, checking each time that the
// shard follows m.
func readClocks(ctx context.Context, m *shardmap.Map, pools []*pgxpool.Pool) ([]clock, error) {
	clocks := make([]clock, len(m.Shards))
	for pass := range 2 {
		for i, s := range m.Shards {
			err := pgx.BeginTxFunc(ctx, pools[i], readOnly, func(tx pgx.Tx) error {
				now, err := checkOwnership(ctx, tx, s.Name, m.Version)
				if pass == 0 {
					clocks[i].t0 = now
				} else {
					clocks[i].t1 = now
				}
				return err
			})
			if err != nil {
				return nil, shardError(s, err)
			}
		}
	}
	return clocks, nil
}

// readOnly is one snapshot, in which PostgreSQL refuses any write.
var readOnly = pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}

// checkOwnership returns the shard's clock, and ErrUnsettled when the shard is not the one
// named, does not follow map version, or has begun applying another.
func checkOwnership(ctx context.Context, tx pgx.Tx, name string, version int64) (time.Time, error) {
	var (
		now               time.Time
		shard             string
		follows, applying int64
	)
	err := tx.QueryRow(ctx, "SELECT now(), shard_name, map_version, applying_version FROM shardgate_shard").
		Scan(&now, &shard, &follows, &applying)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return now, fmt.Errorf("%w: it was never given key ranges; run `router migrate`", ErrUnsettled)
	case err != nil:
		return now, err
	case shard != name:
		return now, fmt.Errorf("%w: its database says it is shard %q; check the map's DSNs", ErrUnsettled, shard)
	case applying != follows:
		return now, fmt.Errorf("%w: the apply of shard map version %d has begun and not finished; finish `router shardmap apply`, then check again",
			ErrUnsettled, applying)
	case follows != version:
		return now, fmt.Errorf("%w: it follows shard map version %d, the map checked is version %d; apply the map or check with the one the shards follow",
			ErrUnsettled, follows, version)
	}
	return now, nil
}

// placeSQL is where a row's keyspace id lies among the shard's ranges (see Place).
const placeSQL = `CASE WHEN EXISTS (SELECT 1 FROM shardgate_owned_range r
                       WHERE r.active AND t.keyspace_id >= r.lo AND (r.hi IS NULL OR t.keyspace_id < r.hi)) THEN 'owned'
            WHEN EXISTS (SELECT 1 FROM shardgate_owned_range r
                       WHERE t.keyspace_id >= r.lo AND (r.hi IS NULL OR t.keyspace_id < r.hi)) THEN 'inactive'
            ELSE 'unowned' END`

// legColumns are the columns of a ledger row as rowFrom scans them.
const legColumns = `t.transfer_id COLLATE "C", t.kind, t.account_id, t.counterparty_id, t.amount, t.currency,
       coalesce(t.reference, ''), t.client, t.created_at, t.keyspace_id, false, ` + placeSQL

// owedColumns are those of an owed-credit row, in the same shape (kind 'owed').
const owedColumns = `t.transfer_id COLLATE "C", 'owed', t.src, t.dst, t.amount, t.currency,
       coalesce(t.reference, ''), t.client, t.debited_at, t.keyspace_id, t.settled_at IS NOT NULL, ` + placeSQL

// scanSQL streams a shard's rows in transfer id order (bytewise, as Go compares strings):
// debits and owed credits written before $1 (t1), credits before $2 (t0). windowSQL does the
// same from $3 for debits and owed credits and $4 for credits, through the indexes on the rows'
// times (migration 0010).
const (
	scanSQL = `SELECT ` + legColumns + ` FROM ledger_entries t
 WHERE (t.kind = 'transfer_out' AND t.created_at < $1) OR (t.kind = 'transfer_in' AND t.created_at < $2)
UNION ALL
SELECT ` + owedColumns + ` FROM shardgate_credit_outbox t WHERE t.debited_at < $1
ORDER BY 1, 2`
	windowSQL = `SELECT ` + legColumns + ` FROM ledger_entries t
 WHERE (t.kind = 'transfer_out' AND t.created_at >= $3 AND t.created_at < $1)
    OR (t.kind = 'transfer_in' AND t.created_at >= $4 AND t.created_at < $2)
UNION ALL
SELECT ` + owedColumns + ` FROM shardgate_credit_outbox t WHERE t.debited_at >= $3 AND t.debited_at < $1
ORDER BY 1, 2`
)

// row is one row of a shard as read: a leg, or an owed credit (owed; settled says whether its
// owed-credit row is settled).
type row struct {
	Leg
	owed, settled bool
}

// scanRow scans the columns of legColumns or owedColumns; t0 is the shard's clock, for ages.
func scanRow(rows pgx.Rows, shard string, t0 time.Time) (row, error) {
	var (
		r                row
		kind, place      string
		account, counter int64
		keyspace         int64
		created          time.Time
	)
	err := rows.Scan(&r.TransferID, &kind, &account, &counter, &r.Amount, &r.Currency, &r.Reference, &r.Client,
		&created, &keyspace, &r.settled, &place)
	r.Shard, r.Age, r.Place = shard, t0.Sub(created), Place(place)
	r.KeyspaceID = uint64(keyspace) ^ 1<<63 // stored with the sign bit flipped
	r.Debit, r.owed = kind == "transfer_out", kind == "owed"
	r.Src, r.Dst = account, counter
	if kind == "transfer_in" {
		r.Src, r.Dst = counter, account
	}
	return r, err
}

// stream is one shard's rows, read in its snapshot, with the next row at hand.
type stream struct {
	shard shardmap.Shard
	t0    time.Time
	tx    pgx.Tx
	rows  pgx.Rows
	next  row
	more  bool
}

func (s *stream) advance() error {
	if s.more = s.rows.Next(); !s.more {
		return s.rows.Err()
	}
	var err error
	s.next, err = scanRow(s.rows, s.shard.Name, s.t0)
	return err
}

// open begins the shard's snapshot, checks its ownership again inside it (an apply begun since
// the clocks were read fails the check rather than moving rows under it), and starts its rows.
func open(ctx context.Context, s shardmap.Shard, pool *pgxpool.Pool, c clock, window time.Duration, version int64) (*stream, error) {
	tx, err := pool.BeginTx(ctx, readOnly)
	if err != nil {
		return nil, err
	}
	st := &stream{shard: s, t0: c.t0, tx: tx}
	if _, err := checkOwnership(ctx, tx, s.Name, version); err != nil {
		st.close(ctx)
		return nil, err
	}
	if window == 0 {
		st.rows, err = tx.Query(ctx, scanSQL, c.t1, c.t0)
	} else {
		st.rows, err = tx.Query(ctx, windowSQL, c.t1, c.t0, c.t1.Add(-window), c.t0.Add(-window-creditMargin))
	}
	if err == nil {
		err = st.advance()
	}
	if err != nil {
		st.close(ctx)
		return nil, err
	}
	return st, nil
}

func (s *stream) close(ctx context.Context) {
	if s.rows != nil {
		s.rows.Close()
	}
	s.tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only: nothing to lose
}

// scan reads every shard at once and judges the rows of each transfer id together.
func (t *tally) scan(ctx context.Context, m *shardmap.Map, pools []*pgxpool.Pool, clocks []clock, window time.Duration) error {
	streams := make([]*stream, 0, len(m.Shards))
	defer func() {
		for _, s := range streams {
			s.close(ctx)
		}
	}()
	for i, s := range m.Shards {
		st, err := open(ctx, s, pools[i], clocks[i], window, m.Version)
		if err != nil {
			return shardError(s, err)
		}
		streams = append(streams, st)
	}
	var group []row
	for {
		id, found := "", false
		for _, s := range streams {
			if s.more && (!found || s.next.TransferID < id) {
				id, found = s.next.TransferID, true
			}
		}
		if !found {
			return nil
		}
		group = group[:0]
		for _, s := range streams {
			for s.more && s.next.TransferID == id {
				group = append(group, s.next)
				if err := s.advance(); err != nil {
					return shardError(s.shard, err)
				}
			}
		}
		t.judge(group)
	}
}

// tally judges transfers as they stream in and keeps what the report needs.
type tally struct {
	m       *shardmap.Map
	window  time.Duration
	debits  int
	credits int
	totals  map[string]*CurrencyTotal
	found   map[Kind]int
	listed  map[Kind][]Discrepancy
	pending *Leg // the oldest
	// Judged only once read again (recheck): debits without credit (missing credits), by
	// transfer id, and credits without debit.
	missing map[string]Discrepancy
	orphans map[string]Leg
}

func newTally(m *shardmap.Map, window time.Duration) *tally {
	return &tally{
		m:       m,
		window:  window,
		totals:  map[string]*CurrencyTotal{},
		found:   map[Kind]int{},
		listed:  map[Kind][]Discrepancy{},
		missing: map[string]Discrepancy{},
		orphans: map[string]Leg{},
	}
}

func (t *tally) total(currency string) *CurrencyTotal {
	c := t.totals[currency]
	if c == nil {
		c = &CurrencyTotal{Currency: currency}
		t.totals[currency] = c
	}
	return c
}

// count adds a leg to the totals.
func (t *tally) count(l Leg) {
	if l.Debit {
		t.debits++
		t.total(l.Currency).Debits += l.Amount
	} else {
		t.credits++
		t.total(l.Currency).Credits += l.Amount
	}
}

// judge takes the rows of one transfer id, from every shard.
func (t *tally) judge(group []row) {
	var debits, credits []Leg
	var owed *row
	for i, r := range group {
		switch {
		case r.Place == Inactive:
			// A copy that the apply's settle deletes; its owner holds the row that counts.
		case r.owed:
			if owed == nil || (r.Place == Owned && owed.Place != Owned) {
				owed = &group[i]
			}
		case r.Debit:
			debits = append(debits, r.Leg)
		default:
			credits = append(credits, r.Leg)
		}
	}
	if len(debits) == 0 && t.window > 0 && !slices.ContainsFunc(credits, func(l Leg) bool { return l.Age <= t.window }) {
		// Credits read from before the window, only so that a debit in it finds its credit
		// whatever the two shards' clocks say: their debits are before the window too.
		return
	}
	for _, l := range slices.Concat(debits, credits) {
		t.count(l)
	}
	debit, credit := t.keep(debits), t.keep(credits)
	switch {
	case debit != nil && credit != nil:
		t.pair(*debit, *credit)
	case debit != nil && owed != nil && !owed.settled:
		t.owe(*debit)
	case debit != nil:
		d := Discrepancy{Kind: MissingCredit, Leg: *debit, Owner: t.m.Route(debit.Dst).Shard, Owed: NoOwedRow}
		if owed != nil {
			d.Owed, d.OwedOn = OwedSettled, owed.Shard
		}
		t.missing[debit.TransferID] = d
	case credit != nil:
		t.orphans[credit.TransferID] = *credit
	}
}

// keep returns the leg of legs that counts as the transfer's, and records every other as a
// duplicate: the leg on the shard the map gives its account, in an owned range, comes first.
func (t *tally) keep(legs []Leg) *Leg {
	if len(legs) == 0 {
		return nil
	}
	rank := func(l Leg) int {
		account := l.Src
		if !l.Debit {
			account = l.Dst
		}
		switch {
		case l.Place == Owned && t.m.Route(account).Shard == l.Shard:
			return 0
		case l.Place == Owned:
			return 1
		}
		return 2
	}
	best := 0
	for i, l := range legs {
		if rank(l) < rank(legs[best]) {
			best = i
		}
	}
	kept := legs[best]
	for i, l := range legs {
		if i != best {
			t.record(Discrepancy{Kind: Duplicate, Leg: l, Other: &kept})
		}
	}
	return &kept
}

// pair checks that a transfer's credit agrees with its debit.
func (t *tally) pair(debit, credit Leg) {
	if debit.Src != credit.Src || debit.Dst != credit.Dst || debit.Amount != credit.Amount || debit.Currency != credit.Currency {
		t.record(Discrepancy{Kind: Mismatch, Leg: debit, Other: &credit})
	}
}

// owe counts a debit whose credit is owed and not delivered yet.
func (t *tally) owe(debit Leg) {
	total := t.total(debit.Currency)
	total.Pending += debit.Amount
	total.PendingCount++
	if t.pending == nil || listedBefore(Discrepancy{Leg: debit}, Discrepancy{Leg: *t.pending}) {
		t.pending = &debit
	}
}

// recheck reads again, outside any snapshot and whatever their time, the other legs of the
// transfers that looked unpaired: a credit whose transaction began before the cut and committed
// after its shard's snapshot is pending, not missing; a debit outside the window (or committed
// late) pairs with its credit.
func (t *tally) recheck(ctx context.Context, m *shardmap.Map, pools []*pgxpool.Pool) error {
	missing, orphans := make([]string, 0, len(t.missing)), make([]string, 0, len(t.orphans))
	for id := range t.missing {
		missing = append(missing, id)
	}
	for id := range t.orphans {
		orphans = append(orphans, id)
	}
	for i, s := range m.Shards {
		credits, err := legsOf(ctx, pools[i], s.Name, "transfer_in", missing)
		if err != nil {
			return shardError(s, err)
		}
		for _, c := range credits {
			if d, ok := t.missing[c.TransferID]; ok {
				delete(t.missing, c.TransferID)
				t.count(c)
				t.pair(d.Leg, c)
			}
		}
		debits, err := legsOf(ctx, pools[i], s.Name, "transfer_out", orphans)
		if err != nil {
			return shardError(s, err)
		}
		for _, d := range debits {
			if c, ok := t.orphans[d.TransferID]; ok {
				delete(t.orphans, d.TransferID)
				t.count(d)
				t.pair(d, c)
			}
		}
	}
	for _, d := range t.missing {
		t.total(d.Leg.Currency).Missing += d.Leg.Amount
		t.record(d)
	}
	for _, c := range t.orphans {
		t.record(Discrepancy{Kind: OrphanCredit, Leg: c})
	}
	return nil
}

// legsOf reads the legs of kind of the transfers ids on one shard, outside inactive ranges,
// a bounded batch of ids per statement.
func legsOf(ctx context.Context, pool *pgxpool.Pool, shard, kind string, ids []string) ([]Leg, error) {
	const batch = 1000
	var out []Leg
	for len(ids) > 0 {
		n := min(batch, len(ids))
		err := pgx.BeginTxFunc(ctx, pool, readOnly, func(tx pgx.Tx) error {
			var now time.Time
			if err := tx.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
				return err
			}
			rows, err := tx.Query(ctx, `SELECT `+legColumns+` FROM ledger_entries t WHERE t.transfer_id = ANY($1) AND t.kind = $2`, ids[:n], kind)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				r, err := scanRow(rows, shard, now)
				if err != nil {
					return err
				}
				if r.Place != Inactive {
					out = append(out, r.Leg)
				}
			}
			return rows.Err()
		})
		if err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	return out, nil
}

// record counts d and keeps it if it is among the MaxListed oldest of its kind (ties by
// transfer id), so that the listing is the same whatever order the rows came in.
func (t *tally) record(d Discrepancy) {
	t.found[d.Kind]++
	listed := t.listed[d.Kind]
	i := sort.Search(len(listed), func(i int) bool { return listedBefore(d, listed[i]) })
	if i == MaxListed {
		return
	}
	listed = slices.Insert(listed, i, d)
	t.listed[d.Kind] = listed[:min(len(listed), MaxListed)]
}

// listedBefore orders discrepancies oldest first, then by transfer id, then by shard.
func listedBefore(a, b Discrepancy) bool {
	if a.Leg.Age != b.Leg.Age {
		return a.Leg.Age > b.Leg.Age
	}
	if a.Leg.TransferID != b.Leg.TransferID {
		return a.Leg.TransferID < b.Leg.TransferID
	}
	return a.Leg.Shard < b.Leg.Shard
}

// report builds the report.
func (t *tally) report(asOf time.Time, window time.Duration) Report {
	r := Report{MapVersion: t.m.Version, AsOf: asOf, Window: window, Debits: t.debits, Credits: t.credits,
		OldestPending: t.pending, Found: t.found, Listed: t.listed}
	for _, s := range t.m.Shards {
		r.Shards = append(r.Shards, s.Name)
	}
	for _, total := range t.totals {
		r.Currencies = append(r.Currencies, *total)
	}
	slices.SortFunc(r.Currencies, func(a, b CurrencyTotal) int { return strings.Compare(a.Currency, b.Currency) })
	for _, d := range t.missing {
		r.Missing = append(r.Missing, d)
	}
	slices.SortFunc(r.Missing, func(a, b Discrepancy) int { return strings.Compare(a.Leg.TransferID, b.Leg.TransferID) })
	return r
}
