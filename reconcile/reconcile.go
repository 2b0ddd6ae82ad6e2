// Package reconcile checks, read-only, that the ledgers of the shards of a shard map add up:
// every debit has its credit on the shard that owns its destination account, no credit exists
// without its debit, the two legs of a transfer agree, and per currency the debits equal the
// credits plus the credits still pending. It is `router reconcile`.
//
// What counts. A ledger row counts for a shard only when its keyspace_id lies in one of that
// shard's active ranges (shardgate_owned_range): the rows of a range being moved are counted
// once, by the shard that owns them, and a credit found only where it is not owned is missing.
// Every shard must follow the map it is checked against, with no apply in flight (an apply
// moves rows under the check): otherwise Run fails with ErrUnsettled.
//
// One moment across shards. Each shard is read in its own READ ONLY, REPEATABLE READ
// transaction, one shard after another, so the shards are not seen at one instant. Before any
// is read, every shard's clock is read twice over: first t0 of every shard, then t1 of every
// shard. Credits written before their shard's t0 and debits written before their shard's t1
// are counted, nothing younger. A credit is delivered only after its debit committed, so the
// debit of a counted credit committed before the credit's shard was asked for t0, hence before
// its own shard was asked for t1, and before every scan began: it is counted too. A transfer
// whose credit lands while the shards are being read is therefore never taken for a credit
// without debit, and no two servers' clocks are ever compared.
//
// Memory. Legs are streamed from each shard. A leg waits in a map keyed by transfer id until
// the other leg of its transfer is read; the pair is then checked and dropped. The map holds at
// most one entry per transfer (when every credit lives on another shard than its debit), and in
// the end only the transfers left unpaired: pending credits and discrepancies. Totals are kept
// per currency, and listings are capped at MaxListed per kind. A shard's snapshot is held for
// as long as its ledger takes to stream, which holds back vacuum there meanwhile.
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

// DefaultOlderThan is the age from which a debit without its credit is a discrepancy unless
// Options say otherwise (`router reconcile --older-than`).
const DefaultOlderThan = time.Hour

// MaxListed is how many discrepancies of each kind a Report keeps (the oldest); the others are
// only counted.
const MaxListed = 20

// ErrUnsettled means a shard does not follow the shard map being checked, or is in the middle
// of applying one: rows may then be counted twice or not at all, so nothing is concluded.
var ErrUnsettled = errors.New("shard ownership does not match the shard map")

// Options are the settings of one check.
type Options struct {
	// OlderThan is the age from which a debit without its credit is a discrepancy; a younger
	// one is pending. Zero makes every debit older than the check's start a discrepancy.
	OlderThan time.Duration
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
	if opts.OlderThan < 0 {
		return Report{}, fmt.Errorf("reconcile: OlderThan is %s; it must be 0 or more", opts.OlderThan)
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
	t := newTally(opts.OlderThan)
	for i, s := range m.Shards {
		if err := t.scan(ctx, s.Name, pools[i], clocks[i], m.Version); err != nil {
			return Report{}, shardError(s, err)
		}
	}
	return t.report(m, clocks[0].t0), nil
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
			err := readOnly(ctx, pools[i], func(tx pgx.Tx) error {
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

// readOnly runs fn in a READ ONLY, REPEATABLE READ transaction on pool: one snapshot, and
// PostgreSQL refuses any write.
func readOnly(ctx context.Context, pool *pgxpool.Pool, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, fn)
}

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

// scanSQL streams the legs a shard counts: those of its active ranges, debits written before
// $1 (t1) and credits before $2 (t0).
const scanSQL = `SELECT t.transfer_id, t.kind = 'transfer_out', t.account_id, t.counterparty_id, t.amount, t.currency, t.created_at
FROM ledger_entries t
WHERE CASE WHEN t.kind = 'transfer_out' THEN t.created_at < $1 ELSE t.created_at < $2 END
  AND EXISTS (SELECT 1 FROM shardgate_owned_range o
              WHERE o.active AND t.keyspace_id >= o.lo AND (o.hi IS NULL OR t.keyspace_id < o.hi))`

// scan reads the counted legs of one shard, in one read-only snapshot, into t.
func (t *tally) scan(ctx context.Context, shard string, pool *pgxpool.Pool, c clock, version int64) error {
	return readOnly(ctx, pool, func(tx pgx.Tx) error {
		// Checked again inside the snapshot: an apply begun since the clocks were read fails
		// the check rather than moving rows under it.
		if _, err := checkOwnership(ctx, tx, shard, version); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, scanSQL, c.t1, c.t0)
		if err != nil {
			return err
		}
		var (
			l                Leg
			account, counter int64
			created          time.Time
		)
		_, err = pgx.ForEachRow(rows, []any{&l.TransferID, &l.Debit, &account, &counter, &l.Amount, &l.Currency, &created}, func() error {
			l.Shard, l.Age = shard, c.t0.Sub(created)
			l.Src, l.Dst = account, counter
			if !l.Debit {
				l.Src, l.Dst = counter, account
			}
			t.add(l)
			return nil
		})
		return err
	})
}

// tally pairs the legs of each transfer as they stream in and keeps what the report needs.
type tally struct {
	olderThan time.Duration
	unpaired  map[string]Leg // transfer id -> the one leg read so far
	debits    int
	credits   int
	totals    map[string]*CurrencyTotal
	found     map[Kind]int
	listed    map[Kind][]Discrepancy
}

func newTally(olderThan time.Duration) *tally {
	return &tally{
		olderThan: olderThan,
		unpaired:  map[string]Leg{},
		totals:    map[string]*CurrencyTotal{},
		found:     map[Kind]int{},
		listed:    map[Kind][]Discrepancy{},
	}
}

// add counts one leg and pairs it with the other leg of its transfer, if that was read.
func (t *tally) add(l Leg) {
	total := t.totals[l.Currency]
	if total == nil {
		total = &CurrencyTotal{Currency: l.Currency}
		t.totals[l.Currency] = total
	}
	if l.Debit {
		t.debits++
		total.Debits += l.Amount
	} else {
		t.credits++
		total.Credits += l.Amount
	}
	first, ok := t.unpaired[l.TransferID]
	switch {
	case !ok:
		t.unpaired[l.TransferID] = l
	case first.Debit == l.Debit:
		// Counted twice over: both are in the totals, the first stays to be paired.
		t.record(Discrepancy{Kind: Duplicate, Leg: first, Other: &l})
	default:
		delete(t.unpaired, l.TransferID)
		debit, credit := first, l
		if l.Debit {
			debit, credit = l, first
		}
		if debit.Src != credit.Src || debit.Dst != credit.Dst || debit.Amount != credit.Amount || debit.Currency != credit.Currency {
			t.record(Discrepancy{Kind: Mismatch, Leg: debit, Other: &credit})
		}
	}
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

// listedBefore orders discrepancies oldest first, then by transfer id.
func listedBefore(a, b Discrepancy) bool {
	if a.Leg.Age != b.Leg.Age {
		return a.Leg.Age > b.Leg.Age
	}
	return a.Leg.TransferID < b.Leg.TransferID
}

// report judges the legs left unpaired and builds the report: an unpaired debit is pending,
// and missing once older than olderThan; an unpaired credit has no debit.
func (t *tally) report(m *shardmap.Map, asOf time.Time) Report {
	r := Report{MapVersion: m.Version, AsOf: asOf, OlderThan: t.olderThan, Debits: t.debits, Credits: t.credits}
	for _, s := range m.Shards {
		r.Shards = append(r.Shards, s.Name)
	}
	for _, l := range t.unpaired {
		if !l.Debit {
			t.record(Discrepancy{Kind: OrphanCredit, Leg: l})
			continue
		}
		total := t.totals[l.Currency]
		total.Pending += l.Amount
		total.PendingCount++
		if r.OldestPending == nil || listedBefore(Discrepancy{Leg: l}, Discrepancy{Leg: *r.OldestPending}) {
			r.OldestPending = &l
		}
		if l.Age > t.olderThan {
			t.record(Discrepancy{Kind: MissingCredit, Leg: l, Owner: m.Route(l.Dst).Shard})
		}
	}
	for _, total := range t.totals {
		r.Currencies = append(r.Currencies, *total)
	}
	slices.SortFunc(r.Currencies, func(a, b CurrencyTotal) int { return strings.Compare(a.Currency, b.Currency) })
	r.Found, r.Listed = t.found, t.listed
	return r
}
