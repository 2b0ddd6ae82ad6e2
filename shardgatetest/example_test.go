package shardgatetest_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/shardgate/shardgate/client"
	"github.com/shardgate/shardgate/shardgatetest"
)

// A service's test against a real shardgate: start it, send a transfer with the Go client,
// freeze the shard that owns it while another transfer is on its way, and retry that one with
// its key once the shard is back: it is applied exactly once. In a test function, use
// shardgatetest.New(t, opts) instead of Start and Close.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	env, err := shardgatetest.Start(ctx, shardgatetest.Options{
		Shards: 2,
		// A frozen shard becomes a retryable 503 after one second instead of the default five.
		RouterYAML: "shard_pool:\n  request_timeout: 1s\n",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer env.Close()

	c, err := client.New(env.URL, client.WithToken(env.Token))
	if err != nil {
		log.Fatal(err)
	}
	first, err := c.Send(ctx, client.NewTransfer(8842, 1190, 2500, "EUR"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first transfer applied:", !first.Replayed)

	// The second transfer's shard hangs: the client's call ends without an answer.
	op := client.NewTransfer(8842, 1190, 700, "EUR") // its key is minted here, once
	shard := env.ShardOf(op.Src)
	if err := shard.Pause(ctx); err != nil {
		log.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 2500*time.Millisecond)
	_, err = c.Send(short, op)
	stop()
	var unknown *client.UnknownOutcomeError
	fmt.Println("while the shard is frozen, outcome unknown:", errors.As(err, &unknown))

	// The shard is back: the same operation, same key, is applied — or, if the frozen attempt
	// committed after all, replayed. Either way exactly once.
	if err := shard.Resume(ctx); err != nil {
		log.Fatal(err)
	}
	rcpt, err := c.Send(ctx, op)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("debits of the retried transfer:", debits(ctx, shard.DSN(), rcpt.Transfer.ID))
	// Output:
	// first transfer applied: true
	// while the shard is frozen, outcome unknown: true
	// debits of the retried transfer: 1
}

// debits counts the ledger's transfer_out rows for a transfer on the shard at dsn.
func debits(ctx context.Context, dsn, transferID string) int {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_out'", transferID).Scan(&n); err != nil {
		log.Fatal(err)
	}
	return n
}
