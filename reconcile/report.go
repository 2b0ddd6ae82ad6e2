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
	// MissingCredit: a debit older than Options.OlderThan whose credit no shard counts (the
	// credit is absent, or only where its range is not active).
	MissingCredit Kind = "missing credit"
	// OrphanCredit: a credit whose debit no shard counts.
	OrphanCredit Kind = "credit without debit"
	// Mismatch: a credit whose accounts, amount or currency differ from its debit's.
	Mismatch Kind = "credit differs from debit"
	// Duplicate: a leg counted by two shards, or twice (two shards own its range).
	Duplicate Kind = "leg counted twice"
)

// Kinds lists every kind of discrepancy, in report order.
var Kinds = []Kind{MissingCredit, OrphanCredit, Mismatch, Duplicate}

// Leg is one ledger row of a transfer, as the check read it.
type Leg struct {
	TransferID string
	Debit      bool   // the transfer_out row; false for the credit, transfer_in
	Shard      string // the shard it was read on
	Src, Dst   int64  // the transfer's accounts, whichever leg this is
	Amount     int64
	Currency   string
	// Age is how long before the check began the row was written, by its shard's clock. A row
	// written while the check began may have a slightly negative age.
	Age time.Duration
}

// Discrepancy is one transfer that does not add up.
type Discrepancy struct {
	Kind Kind
	// Leg is what was found: the debit of a missing credit or a mismatch, the credit of a
	// credit without debit, the leg read first of a duplicate.
	Leg Leg
	// Other is the credit of a mismatch and the leg read second of a duplicate; nil otherwise.
	Other *Leg
	// Owner is, for a missing credit, the shard the map gives the credit's account: where the
	// credit belongs.
	Owner string
}

// CurrencyTotal is the sum of the amounts of one currency's legs. Pending is the part of
// Debits whose credits were not found (PendingCount debits). Amounts are in minor units, summed
// in int64.
type CurrencyTotal struct {
	Currency                 string
	Debits, Credits, Pending int64
	PendingCount             int
}

// Balanced reports whether the currency's debits equal its credits plus its pending credits.
func (c CurrencyTotal) Balanced() bool { return c.Debits == c.Credits+c.Pending }

// Report is what Run found.
type Report struct {
	MapVersion int64
	Shards     []string      // the shards checked, in map order
	AsOf       time.Time     // when the check began, by the first shard's clock
	OlderThan  time.Duration // Options.OlderThan
	// Debits and Credits count the legs read (duplicates included).
	Debits, Credits int
	Currencies      []CurrencyTotal // by currency code
	// OldestPending is the oldest debit whose credit was not found, if any: pending while
	// younger than OlderThan, and a MissingCredit past it.
	OldestPending *Leg
	// Found counts the discrepancies of each kind; Listed keeps the MaxListed oldest of each.
	Found  map[Kind]int
	Listed map[Kind][]Discrepancy
}

// Discrepancies counts every discrepancy: those of each kind, and each currency that does not
// balance.
func (r Report) Discrepancies() int {
	n := 0
	for _, k := range Kinds {
		n += r.Found[k]
	}
	for _, c := range r.Currencies {
		if !c.Balanced() {
			n++
		}
	}
	return n
}

// Clean reports whether the ledgers add up: no discrepancy of any kind, every currency balanced.
// Pending credits younger than OlderThan are no discrepancy.
func (r Report) Clean() bool { return r.Discrepancies() == 0 }

// Print writes the report for people: totals per currency, the oldest pending credit, and each
// kind of discrepancy with its count and at most MaxListed examples.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "reconcile: shard map version %d, %d shards (%s), ledger rows written before %s\n",
		r.MapVersion, len(r.Shards), strings.Join(r.Shards, ", "), r.AsOf.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "read %d debits and %d credits; a debit older than %s must have its credit\n\n", r.Debits, r.Credits, r.OlderThan)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "currency\tdebits\tcredits\tpending\tpending credits\tbalanced")
	for _, c := range r.Currencies {
		balanced := "yes"
		if !c.Balanced() {
			balanced = fmt.Sprintf("NO: debits - credits - pending = %d", c.Debits-c.Credits-c.Pending)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%s\n", c.Currency, c.Debits, c.Credits, c.Pending, c.PendingCount, balanced)
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
		fmt.Fprintf(tw, "  %s\t%s on %s\t%d -> %d\t%d %s\tage %s", l.TransferID, legName(l), l.Shard, l.Src, l.Dst, l.Amount, l.Currency, age(l.Age))
		switch {
		case d.Owner != "":
			fmt.Fprintf(tw, "\tcredit belongs on %s", d.Owner)
		case d.Other != nil:
			o := d.Other
			fmt.Fprintf(tw, "\t%s on %s: %d -> %d, %d %s", legName(*o), o.Shard, o.Src, o.Dst, o.Amount, o.Currency)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush() //nolint:errcheck // as in Print
	if more := r.Found[k] - len(r.Listed[k]); more > 0 {
		fmt.Fprintf(w, "  ... and %d more\n", more)
	}
}

func legName(l Leg) string {
	if l.Debit {
		return "debit"
	}
	return "credit"
}

// age prints a duration to the second; a row written as the check began is 0s old.
func age(d time.Duration) time.Duration { return max(d, 0).Round(time.Second) }
