package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"

	"github.com/shardgate/shardgate/client"
)

// The pattern: mint the key with the operation, store both durably, then send — and after a
// restart, send the stored operation again, key and all.
func Example() {
	router := standInRouter()
	defer router.Close()
	dir, err := os.MkdirTemp("", "shardgate-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	opFile := filepath.Join(dir, "transfer.json")

	// 1. Decide the transfer: this mints its key, once.
	op := client.NewTransfer(8842, 1190, 2500, "EUR")
	op.Reference = "invoice 2026-117"
	// 2. Store it, key included, before the first attempt.
	if err := store(opFile, op); err != nil {
		log.Fatal(err)
	}
	// 3. Send it. Retries (here after a 503) reuse op.Key and the same body.
	c, err := client.New(router.URL, client.WithToken("token-a"))
	if err != nil {
		log.Fatal(err)
	}
	report(c.Send(context.Background(), op))

	// After a crash nobody knows whether the answer arrived: load the stored operation and send
	// it again. The router replays its stored answer; nothing is applied twice.
	var again client.Transfer
	if err := load(opFile, &again); err != nil {
		log.Fatal(err)
	}
	report(c.Send(context.Background(), again))
	// Output:
	// applied 2500 EUR from 8842 to 1190 (replayed: false, attempts: 2)
	// applied 2500 EUR from 8842 to 1190 (replayed: true, attempts: 1)
}

// The payer's balance right after a transfer to an account on another shard: the money has
// left it (debits) and is still on its way (pending_out) until the router delivers the credit.
func ExampleClient_Balance() {
	router := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"account":8842,"balances":[{"currency":"EUR","balance":-2500,"credits":0,"debits":2500,"pending_out":2500}]}`)
	}))
	defer router.Close()
	c, err := client.New(router.URL, client.WithToken("token-a"))
	if err != nil {
		log.Fatal(err)
	}
	b, err := c.Balance(context.Background(), 8842)
	if err != nil {
		log.Fatal(err)
	}
	eur, _ := b.In("EUR")
	fmt.Printf("account %d: balance %d EUR; %d EUR sent is not delivered yet\n", b.Account, eur.Balance, eur.PendingOut)
	// Output: account 8842: balance -2500 EUR; 2500 EUR sent is not delivered yet
}

func report(rc *client.Receipt, err error) {
	var unknown *client.UnknownOutcomeError
	switch {
	case errors.As(err, &unknown):
		fmt.Println("outcome unknown; keep the stored operation and send it again later:", err)
	case errors.Is(err, client.ErrKeyReused), errors.Is(err, client.ErrKeyExpired):
		fmt.Println("never resend this operation; reconcile it by hand:", err)
	case err != nil:
		fmt.Println("refused:", err)
	default:
		t := rc.Transfer
		fmt.Printf("applied %d %s from %d to %d (replayed: %t, attempts: %d)\n", t.Amount, t.Currency, t.Src, t.Dst, rc.Replayed, rc.Attempts)
	}
}

// store writes op to path durably: a temporary file, fsync, rename.
func store(path string, op client.Transfer) error {
	b, err := json.Marshal(op)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".op-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func load(path string, op *client.Transfer) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, op)
}

// standInRouter answers its first request 503 and then behaves like the router: a key seen
// before gets its stored answer again, marked Idempotent-Replayed.
func standInRouter() *httptest.Server {
	var mu sync.Mutex
	calls := 0
	stored := map[string][]byte{}
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if calls++; calls == 1 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"type":"https://shardgate.dev/problems/shard-unavailable","title":"The shard that owns this account is unavailable","status":503}`)
			return
		}
		key := r.Header.Get("Idempotency-Key")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/transfers/1d65d16c18855fc7aa")
		if body, ok := stored[key]; ok {
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
			w.Write(body)
			return
		}
		var in map[string]any
		json.NewDecoder(r.Body).Decode(&in)
		in["id"] = "1d65d16c18855fc7aa"
		stored[key], _ = json.Marshal(in)
		w.WriteHeader(http.StatusCreated)
		w.Write(stored[key])
	}))
}
