// Command transfer sends money transfers through a shardgate router the way the
// idempotency-keys guide asks: each transfer gets its Idempotency-Key when it is enqueued, is
// written durably to a state file before its first attempt, and is sent — on this run or, if
// the outcome is unknown or the process died, on a later one — always with that same key.
//
//	transfer --url http://127.0.0.1:8080 --state transfers.json -src 8842 -dst 1190 -amount 2500
//	transfer --state transfers.json          # resume: send every pending transfer again
//
// The token comes from --token or SHARDGATE_TOKEN. Every run first sends the pending transfers
// of the state file, then exits 0 if every transfer it sent was applied, 1 otherwise (see the
// state file: "pending" ones are sent again on the next run, "rejected" and "expired" ones
// never), and 2 for a usage error. Use one process at a time per state file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/shardgate/shardgate/client"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the command line's settings.
type options struct {
	url, token, state   string
	src, dst, amount    int64
	currency, reference string
	timeout             time.Duration
	enqueue             bool // -src, -dst and -amount were given: add a transfer
}

func parseFlags(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("transfer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.url, "url", "http://127.0.0.1:8080", "the router's base URL")
	fs.StringVar(&o.token, "token", getenv("SHARDGATE_TOKEN"), "bearer token (default $SHARDGATE_TOKEN)")
	fs.StringVar(&o.state, "state", "transfers.json", "the state file: every transfer, its key and its outcome")
	fs.Int64Var(&o.src, "src", 0, "enqueue a transfer from this account (with -dst and -amount)")
	fs.Int64Var(&o.dst, "dst", 0, "the enqueued transfer's destination account")
	fs.Int64Var(&o.amount, "amount", 0, "the enqueued transfer's amount, in minor units")
	fs.StringVar(&o.currency, "currency", "EUR", "the enqueued transfer's ISO 4217 currency")
	fs.StringVar(&o.reference, "reference", "", "the enqueued transfer's reference")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to keep retrying each transfer on this run")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.enqueue = set["src"] || set["dst"] || set["amount"]
	if o.enqueue && !(set["src"] && set["dst"] && set["amount"]) {
		return o, errors.New("to enqueue a transfer give all of -src, -dst and -amount")
	}
	if o.timeout <= 0 {
		return o, errors.New("-timeout must be positive")
	}
	return o, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, getenv, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stderr, "transfer:", err)
		}
		return 2
	}
	c, err := client.New(o.url, client.WithToken(o.token))
	if err != nil {
		fmt.Fprintln(stderr, "transfer:", err)
		return 2
	}
	j, err := openJournal(o.state)
	if err != nil {
		fmt.Fprintln(stderr, "transfer:", err)
		return 1
	}
	if o.enqueue {
		t := client.NewTransfer(o.src, o.dst, o.amount, o.currency)
		t.Reference = o.reference
		j.Operations = append(j.Operations, &operation{Transfer: t, State: statePending, CreatedAt: time.Now().UTC()})
		// Durable before the first attempt: if this process dies during the send, the next run
		// finds the transfer, key included, and sends it again instead of forgetting it.
		if err := j.save(); err != nil {
			fmt.Fprintln(stderr, "transfer: the transfer was not enqueued and not sent:", err)
			return 1
		}
	}
	return sendPending(ctx, c, j, o.timeout, stdout, stderr)
}

// sendPending sends every pending operation of j and records each outcome as it comes.
func sendPending(ctx context.Context, c *client.Client, j *journal, timeout time.Duration, stdout, stderr io.Writer) int {
	code := 0
	if len(j.pending()) == 0 {
		fmt.Fprintln(stdout, j.nothingPending())
	}
	for _, op := range j.pending() {
		if ctx.Err() != nil { // interrupted: the rest stays pending for the next run
			return 1
		}
		sctx, cancel := context.WithTimeout(ctx, timeout)
		rc, err := c.Send(sctx, op.Transfer)
		cancel()
		op.record(rc, err)
		if err := j.save(); err != nil {
			fmt.Fprintln(stderr, "transfer:", err)
			return 1
		}
		fmt.Fprintln(stdout, op.summary())
		if op.State != stateApplied {
			code = 1
		}
	}
	return code
}

// record sets op's state from the outcome of a Send.
func (op *operation) record(rc *client.Receipt, err error) {
	op.Sends++
	op.LastError = ""
	if err != nil {
		op.LastError = err.Error()
	}
	var unknown *client.UnknownOutcomeError
	var prob *client.Problem
	switch {
	case rc != nil: // applied, even if its description could not be decoded
		op.State, op.TransferID, op.Replayed = stateApplied, rc.Transfer.ID, rc.Replayed
		if op.TransferID == "" {
			op.TransferID = strings.TrimPrefix(rc.Location, "/transfers/")
		}
	case errors.As(err, &unknown):
		op.State = statePending
	case errors.Is(err, client.ErrKeyExpired):
		op.State = stateExpired
	case errors.As(err, &prob) && refusedForGood(prob.Status):
		op.State = stateRejected
	default: // 401, 500, a bad URL: nothing was applied; the same transfer may be sent again
		op.State = statePending
	}
}

// refusedForGood reports the statuses after which sending the same transfer again can only get
// the same answer.
func refusedForGood(status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		return true
	}
	return false
}

func (op *operation) summary() string {
	t := op.Transfer
	s := fmt.Sprintf("%s %s: %d %s from %d to %d", op.State, t.Key, t.Amount, t.Currency, t.Src, t.Dst)
	switch {
	case op.State == stateApplied:
		s += fmt.Sprintf(" id=%s replayed=%t", op.TransferID, op.Replayed)
	case op.LastError != "":
		s += ": " + op.LastError
	}
	return s
}

// nothingPending says that a run had nothing to send, what the state file holds, and how to
// add a transfer.
func (j *journal) nothingPending() string {
	count := map[string]int{}
	for _, op := range j.Operations {
		count[op.State]++
	}
	if len(j.Operations) == 0 {
		return fmt.Sprintf("nothing pending: %s holds no transfers; enqueue one with -src, -dst and -amount", j.path)
	}
	return fmt.Sprintf("nothing pending: all %d transfers in %s are settled (%d applied, %d rejected, %d expired); enqueue another with -src, -dst and -amount",
		len(j.Operations), j.path, count[stateApplied], count[stateRejected], count[stateExpired])
}
