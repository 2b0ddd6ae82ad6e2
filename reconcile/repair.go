package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/shardmap"
)

// repairNote is the last_error of an owed-credit row that Repair made owed again: what an
// operator reading the row sees.
const repairNote = "owed again by router reconcile --repair: its credit was missing"

// oweAgainSQL makes the credit of transfer $1 owed on the debit's shard, unless a credit of it
// is in this shard's ledger: a settled owed-credit row becomes unsettled and due now; a missing
// one is written again from the debit. A row that is unsettled already is left as it is, so a
// second repair changes nothing. inserted says which of the two it did; no row, neither.
const oweAgainSQL = `INSERT INTO shardgate_credit_outbox AS o
       (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at, last_error)
SELECT d.transfer_id, d.keyspace_id, d.account_id, d.counterparty_id, d.amount, d.currency, d.reference, d.client, d.created_at, $2
  FROM ledger_entries d
 WHERE d.transfer_id = $1 AND d.kind = 'transfer_out'
   AND NOT EXISTS (SELECT 1 FROM ledger_entries c WHERE c.transfer_id = $1 AND c.kind = 'transfer_in')
ON CONFLICT (transfer_id) DO UPDATE
   SET settled_at = NULL, next_attempt_at = now(), attempts = 0, lease_owner = NULL, lease_until = NULL, last_error = EXCLUDED.last_error
 WHERE o.settled_at IS NOT NULL
RETURNING xmax = 0`

// Repair makes every missing credit of r owed again, so that the relay delivers it once: it
// re-reads every shard for a credit of each transfer first, and leaves alone any that has one
// now. It writes one line per action to out and returns how many credits it made owed. Credits
// without debit, duplicates and differing credits are not repaired: they need a person's
// decision, and the report says what undoes each. Run it again and it does nothing.
func Repair(ctx context.Context, m *shardmap.Map, pool func(shard string) *pgxpool.Pool, r Report, out io.Writer) (int, error) {
	ids := make([]string, len(r.Missing))
	for i, d := range r.Missing {
		ids[i] = d.Leg.TransferID
	}
	credited := map[string]string{} // transfer id -> a shard that holds a credit of it now
	for _, s := range m.Shards {
		p := pool(s.Name)
		if p == nil {
			return 0, fmt.Errorf("shard %s: no connection pool was opened for it", s.Name)
		}
		credits, err := legsOf(ctx, p, s.Name, "transfer_in", ids)
		if err != nil {
			return 0, shardError(s, err)
		}
		for _, c := range credits {
			credited[c.TransferID] = s.Name
		}
	}
	owed := 0
	for _, d := range r.Missing {
		l := d.Leg
		switch {
		case credited[l.TransferID] != "":
			fmt.Fprintf(out, "repair: %s: left alone, its credit is on %s now\n", l.TransferID, credited[l.TransferID])
			continue
		case l.Place != Owned:
			fmt.Fprintf(out, "repair: %s: left alone, its debit on %s is outside the ranges %s owns, where no relay claims an owed credit; apply the shard map first\n",
				l.TransferID, l.Shard, l.Shard)
			continue
		}
		dst := m.Route(l.Dst).Shard
		var inserted bool
		err := pool(l.Shard).QueryRow(ctx, oweAgainSQL, l.TransferID, repairNote).Scan(&inserted)
		switch {
		case err == nil && inserted:
			fmt.Fprintf(out, "repair: %s: owed-credit row written again on %s from its debit (%d -> %d, %d %s); the relay delivers it to %s\n",
				l.TransferID, l.Shard, l.Src, l.Dst, l.Amount, l.Currency, dst)
		case err == nil:
			fmt.Fprintf(out, "repair: %s: owed again on %s, its owed-credit row no longer settled (%d -> %d, %d %s); the relay delivers it to %s\n",
				l.TransferID, l.Shard, l.Src, l.Dst, l.Amount, l.Currency, dst)
		case isNoRows(err):
			fmt.Fprintf(out, "repair: %s: left alone, it is owed already or its credit is on %s now\n", l.TransferID, l.Shard)
			continue
		default:
			return owed, shardError(*m.Shard(l.Shard), err)
		}
		owed++
	}
	return owed, nil
}

func isNoRows(err error) bool { return errors.Is(err, pgx.ErrNoRows) }
