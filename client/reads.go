package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// GetTransfer returns the transfer with the given id (the last segment of a receipt's
// Location), with the state of its credit leg in Credit. A transfer of another client, or none,
// is a [*Problem] with status 404. Reads are retried like transfers; when retrying stops the
// error wraps the last failure. Once the source's shard no longer lists the credit (written
// with the debit, or delivered and cleared), the read needs the destination account's shard
// too, and fails with a 503 problem while that shard is down.
func (c *Client) GetTransfer(ctx context.Context, id string) (*TransferRecord, error) {
	if id == "" {
		return nil, errors.New("shardgate: GetTransfer needs a transfer id, as returned in a receipt's Location")
	}
	var rec TransferRecord
	if err := c.getJSON(ctx, "/transfers/"+url.PathEscape(id), &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// AccountBalance is an account's position in each currency, as GET /accounts/{id}/balance
// reports it from the shard that owns the account.
type AccountBalance struct {
	Account int64 `json:"account"`
	// Balances has one entry per currency the account has ledger rows in, ordered by currency
	// code; it is empty for an account without any.
	Balances []CurrencyBalance `json:"balances"`
}

// CurrencyBalance is an account's position in one currency, in minor units.
type CurrencyBalance struct {
	Currency string `json:"currency"`
	// Balance is Credits − Debits.
	Balance int64 `json:"balance"`
	// Credits is the money received. Credits on their way to the account (pending on the
	// payer's shard) are not in it until they are delivered.
	Credits int64 `json:"credits"`
	// Debits is the money sent.
	Debits int64 `json:"debits"`
	// PendingOut is the part of Debits whose credit has not reached its destination yet.
	PendingOut int64 `json:"pending_out"`
}

// In returns the account's position in currency, and false (with a zero position) if the
// account has no ledger rows in that currency.
func (b *AccountBalance) In(currency string) (CurrencyBalance, bool) {
	for _, cb := range b.Balances {
		if cb.Currency == currency {
			return cb, true
		}
	}
	return CurrencyBalance{Currency: currency}, false
}

// Balance returns account's balance in each currency (GET /accounts/{id}/balance). Any
// authenticated client may read any account. Reads are retried like transfers, including a 503
// while the account's key range moves between shards; when retrying stops the error wraps the
// last failure, a [*Problem] or a network error.
func (c *Client) Balance(ctx context.Context, account int64) (*AccountBalance, error) {
	var b AccountBalance
	if err := c.getJSON(ctx, "/accounts/"+strconv.FormatInt(account, 10)+"/balance", &b); err != nil {
		return nil, err
	}
	return &b, nil
}

// getJSON reads path, retrying, and decodes its 200 answer into v.
func (c *Client) getJSON(ctx context.Context, path string, v any) error {
	rep, err := c.do(ctx, call{method: http.MethodGet, path: path, answers: []int{http.StatusOK}})
	if err != nil {
		return err
	}
	if err := json.Unmarshal(rep.body, v); err != nil {
		return fmt.Errorf("shardgate: decoding the answer to GET %s: %w", path, err)
	}
	return nil
}

// Healthz reports whether the router process is alive (GET /healthz). It makes one attempt.
func (c *Client) Healthz(ctx context.Context) error {
	_, err := c.do(ctx, call{method: http.MethodGet, path: "/healthz", answers: []int{http.StatusOK}, once: true})
	return err
}

// Readiness is the answer of GET /readyz.
type Readiness struct {
	// Ready is true when the router answered 200.
	Ready           bool              `json:"-"`
	ShardMapVersion int64             `json:"shardmap_version"`
	Shards          map[string]string `json:"shards"` // shard name → "ok" or "unreachable"
}

// Readyz asks whether the router is ready (GET /readyz): its map is loaded and every shard
// answers — or, with partial, at least one. A router that is not ready is not an error: it is a
// Readiness with Ready false. It makes one attempt.
func (c *Client) Readyz(ctx context.Context, partial bool) (*Readiness, error) {
	path := "/readyz"
	if partial {
		path += "?partial=1"
	}
	rep, err := c.do(ctx, call{method: http.MethodGet, path: path, answers: []int{http.StatusOK, http.StatusServiceUnavailable}, once: true})
	if err != nil {
		return nil, err
	}
	r := &Readiness{Ready: rep.status == http.StatusOK}
	if err := json.Unmarshal(rep.body, r); err != nil {
		return nil, fmt.Errorf("shardgate: decoding the answer to GET %s (%d): %w", path, rep.status, err)
	}
	return r, nil
}
