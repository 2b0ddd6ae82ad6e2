package reconcile

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Kind is a kind of discrepancy.
type Kind string

// The kinds of discrepancy, in the order a report lists them.
const (
	// MissingCredit: a debit whose credit no shard holds while nothing owes it: its owed-credit
	// row says settled, or it has none. Whatever its age: nothing will ever deliver it.
	MissingCredit Kind = "missing credit"
	// OrphanCredit: a credit whose debit no shard holds.
	OrphanCredit Kind = "credit without debit"
	// Mismatch: a credit whose accounts, amount or currency differ from its debit's.
	Mismatch Kind = "credit differs from debit"
	// Duplicate: a second copy of a leg, on any shard, under any keyspace id.
	Duplicate Kind = "leg counted twice"
)

// Kinds lists every kind of discrepancy, in report order.
var Kinds = []Kind{MissingCredit, OrphanCredit, Mismatch, Duplicate}

// Place is where a row's keyspace id lies among the ranges of the shard it is on.
type Place string

// The places of a row.
const (
	Owned Place = "owned" // in a range the shard owns: where a transfer writes it
	// Inactive: in a range moving away or copied ahead of a grant; the apply's settle deletes
	// it, and the check does not count it.
	Inactive Place = "inactive"
	Unowned  Place = "unowned" // in no range of the shard: written by hand, or by a stale copy
)

// Leg is one ledger row of a transfer, as the check read it.
type Leg struct {
	TransferID string
	Debit      bool   // the transfer_out row; false for the credit, transfer_in
	Shard      string // the shard it was read on
	Src, Dst   int64  // the transfer's accounts, whichever leg this is
	Amount     int64
	Currency   string
	Client     string
	Reference  string
	KeyspaceID uint64 // the row's own keyspace id
	Place      Place  // where KeyspaceID lies among Shard's ranges
	// Age is how long before the check began the row was written, by its shard's clock. A row
	// written while the check began may have a slightly negative age.
	Age time.Duration
}

// OwedState is, for a missing credit, what its debit's shard holds of it.
type OwedState string

// The states of a missing credit's owed-credit row.
const (
	OwedSettled OwedState = "settled" // the row says delivered: the credit was lost afterwards
	NoOwedRow   OwedState = "none"    // no row: the credit and its row are gone
)

// Discrepancy is one transfer that does not add up.
type Discrepancy struct {
	Kind Kind
	// Leg is what was found: the debit of a missing credit or a mismatch, the credit of a
	// credit without debit, the extra copy of a duplicate (on the shard it is on).
	Leg Leg
	// Other is the credit of a mismatch and the copy that counts of a duplicate; nil otherwise.
	Other *Leg
	// Owner is, for a missing credit, the shard the map gives the credit's account: where the
	// credit belongs.
	Owner string
	// Owed and OwedOn are, for a missing credit, its owed-credit row and the shard it is on.
	Owed   OwedState
	OwedOn string
}

// CurrencyTotal is the sum of the amounts of one currency's legs. Pending is the part of
// Debits whose credits are owed and not delivered yet (PendingCount debits); Missing the part
// whose credits are missing. Amounts are in minor units, summed in int64.
type CurrencyTotal struct {
	Currency                          string
	Debits, Credits, Pending, Missing int64
	PendingCount                      int
}

// Balanced reports whether the currency's debits equal its credits plus its pending and
// missing credits: a missing credit is one discrepancy, listed as such, not a second one here.
func (c CurrencyTotal) Balanced() bool { return c.Debits == c.Credits+c.Pending+c.Missing }

// Report is what Run found.
type Report struct {
	MapVersion int64
	Shards     []string      // the shards checked, in map order
	AsOf       time.Time     // when the check began, by the first shard's clock
	Window     time.Duration // Options.Window; 0 for the whole history
	// Debits and Credits count the legs read (duplicates included).
	Debits, Credits int
	Currencies      []CurrencyTotal // by currency code
	// OldestPending is the oldest debit whose credit is owed and not delivered yet, if any.
	OldestPending *Leg
	// Found counts the discrepancies of each kind; Listed keeps the MaxListed oldest of each.
	Found  map[Kind]int
	Listed map[Kind][]Discrepancy
	// Missing is every missing credit, by transfer id: what Repair makes owed again.
	Missing []Discrepancy
}

// Discrepancies counts every discrepancy: those of each kind, and each currency that does not
// balance.
func (r Report) Discrepancies() int {
	n := 0
	for _, k := range Kinds {
		n += r.Found[k]
	}
	return n + r.Unbalanced()
}

// Unbalanced counts the currencies that do not balance.
func (r Report) Unbalanced() int {
	n := 0
	for _, c := range r.Currencies {
		if !c.Balanced() {
			n++
		}
	}
	return n
}

// Clean reports whether the ledgers add up: no discrepancy of any kind, every currency balanced.
// Credits owed and not delivered yet are no discrepancy.
func (r Report) Clean() bool { return r.Discrepancies() == 0 }

// Print writes the report for people: totals per currency, the oldest pending credit, and each
// kind of discrepancy with its count and at most MaxListed examples.
func (r Report) Print(w io.Writer) {
	scope := "the whole history before"
	if r.Window > 0 {
		scope = "transfers debited in the " + r.Window.String() + " before"
	}
	fmt.Fprintf(w, "reconcile: shard map version %d, %d shards (%s), %s %s\n",
		r.MapVersion, len(r.Shards), strings.Join(r.Shards, ", "), scope, r.AsOf.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "read %d debits and %d credits\n\n", r.Debits, r.Credits)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "currency\tdebits\tcredits\tpending\tpending credits\tmissing\tbalanced")
	for _, c := range r.Currencies {
		balanced := "yes"
		if !c.Balanced() {
			balanced = fmt.Sprintf("NO: debits - credits - pending - missing = %d", c.Debits-c.Credits-c.Pending-c.Missing)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", c.Currency, c.Debits, c.Credits, c.Pending, c.PendingCount, c.Missing, balanced)
	}
	tw.Flush() //nolint:errcheck // a report to w; w's errors are the caller's to see
	if len(r.Currencies) == 0 {
		fmt.Fprintln(w, "(no ledger rows)")
	}
	if p := r.OldestPending; p != nil {
		fmt.Fprintf(w, "\noldest pending credit: %s, debited %s ago on %s (%d -> %d, %d %s)\n",
			p.TransferID, age(p.Age), p.Shard, p.Src, p.Dst, p.Amount, p.Currency)
	} else {
		fmt.Fprintln(w, "\nno pending credits")
	}
	fmt.Fprintln(w)
	for _, k := range Kinds {
		r.printKind(w, k)
	}
	if r.Clean() {
		fmt.Fprintln(w, "result: clean")
	} else {
		fmt.Fprintf(w, "result: %d discrepancies\n", r.Discrepancies())
	}
}

// printKind writes one kind's count and listing.
func (r Report) printKind(w io.Writer, k Kind) {
	fmt.Fprintf(w, "%s: %d\n", k, r.Found[k])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, d := range r.Listed[k] {
		l := d.Leg
		fmt.Fprintf(tw, "  %s\t%s on %s\t%d -> %d\t%d %s\tage %s\t%s", l.TransferID, legName(l), l.Shard, l.Src, l.Dst,
			l.Amount, l.Currency, age(l.Age), what(d))
		fmt.Fprintln(tw)
	}
	tw.Flush() //nolint:errcheck // as in Print
	if more := r.Found[k] - len(r.Listed[k]); more > 0 {
		fmt.Fprintf(w, "  ... and %d more\n", more)
	}
}

// what says, for people, what a discrepancy is and what undoes it.
func what(d Discrepancy) string {
	switch d.Kind {
	case MissingCredit:
		if d.Owed == OwedSettled {
			return fmt.Sprintf("credit belongs on %s; its owed-credit row on %s says settled (--repair owes it again)", d.Owner, d.OwedOn)
		}
		return fmt.Sprintf("credit belongs on %s; no owed-credit row (--repair owes it again)", d.Owner)
	case OrphanCredit:
		l := d.Leg
		return fmt.Sprintf("to reverse: debit account %d by %d %s on %s (credit key %q of client %q, reference %q, keyspace id %016x)",
			l.Dst, l.Amount, l.Currency, l.Shard, l.TransferID, l.Client, l.Reference, l.KeyspaceID)
	case Duplicate:
		o := d.Other
		return fmt.Sprintf("extra copy under keyspace id %016x (%s on %s); the copy that counts is on %s",
			d.Leg.KeyspaceID, d.Leg.Place, d.Leg.Shard, o.Shard)
	case Mismatch:
		o := d.Other
		return fmt.Sprintf("%s on %s: %d -> %d, %d %s", legName(*o), o.Shard, o.Src, o.Dst, o.Amount, o.Currency)
	}
	return ""
}

func legName(l Leg) string {
	if l.Debit {
		return "debit"
	}
	return "credit"
}

// age prints a duration to the second; a row written as the check began is 0s old.
func age(d time.Duration) time.Duration { return max(d, 0).Round(time.Second) }
