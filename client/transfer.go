package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// Transfer is one transfer operation: what to move and the Idempotency-Key that names the
// operation. Its JSON form (with the key) is meant to be stored before the first attempt, so
// that after a crash the very same operation, key included, can be sent again.
//
// Do not change a Transfer's fields once it has been sent: the server answers a key sent with
// a different request with [ErrKeyReused]. A new operation, even an identical one a minute
// later, needs a new Transfer with a new key.
type Transfer struct {
	Key    string `json:"key"`
	Src    int64  `json:"src"`
	Dst    int64  `json:"dst"`
	Amount int64  `json:"amount"` // in minor units, > 0
	// Currency is an ISO 4217 code. Empty means the server's default currency: set it
	// explicitly, because if the server's default changes while a retry is pending, the retry
	// is a different request and is answered with ErrKeyReused.
	Currency string `json:"currency,omitempty"`
	// Reference is free text for the payee, at most 140 characters.
	Reference string `json:"reference,omitempty"`
}

// NewTransfer returns a transfer operation with a freshly minted key (see [NewKey]). Store
// the returned value before sending it.
func NewTransfer(src, dst, amount int64, currency string) Transfer {
	return Transfer{Key: NewKey(), Src: src, Dst: dst, Amount: amount, Currency: currency}
}

// body is the POST /transfers request body: the transfer without its key, which travels in
// the Idempotency-Key header.
func (t Transfer) body() []byte {
	b, _ := json.Marshal(struct {
		Src       int64  `json:"src"`
		Dst       int64  `json:"dst"`
		Amount    int64  `json:"amount"`
		Currency  string `json:"currency,omitempty"`
		Reference string `json:"reference,omitempty"`
	}{t.Src, t.Dst, t.Amount, t.Currency, t.Reference}) // ints and strings always encode
	return b
}

// TransferRecord is a transfer as the API describes it. Fields the server adds later are kept in
// Extra rather than refused.
type TransferRecord struct {
	ID        string `json:"id"`
	Src       int64  `json:"src"`
	Dst       int64  `json:"dst"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference,omitempty"`
	// CreatedAt is set by GET /transfers/{id}; the answer to POST /transfers does not carry it.
	CreatedAt time.Time `json:"created_at,omitzero"`
	// Credit is where the transfer's credit leg stands, set by GET /transfers/{id}; the answer
	// to POST /transfers is stored before the credit is decided and does not carry it (nil).
	Credit *Credit `json:"credit,omitempty"`
	// Extra holds the fields of the answer this version of the package does not know.
	Extra map[string]json.RawMessage `json:"-"`
}

// UnmarshalJSON decodes leniently: unknown fields go to Extra.
func (r *TransferRecord) UnmarshalJSON(b []byte) error {
	type plain TransferRecord // without this method
	if err := json.Unmarshal(b, (*plain)(r)); err != nil {
		return err
	}
	var all map[string]json.RawMessage
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	for _, known := range []string{"id", "src", "dst", "amount", "currency", "reference", "created_at", "credit"} {
		delete(all, known)
	}
	r.Extra = nil
	if len(all) > 0 {
		r.Extra = all
	}
	return nil
}

// CreditState is where a transfer's credit leg stands. A state this version of the package does
// not know is kept as the server sent it; treat it as not settled.
type CreditState string

// The states of a credit: pending, then settled, never back.
const (
	// CreditPending means the debit applied and the credit is owed to the shard that owns the
	// destination account: the server delivers it, normally within a second, and keeps
	// retrying while that shard is unavailable. The money is not in Dst's balance yet; it is in
	// Src's PendingOut.
	CreditPending CreditState = "pending"
	// CreditSettled means the credit is in the destination account's ledger.
	CreditSettled CreditState = "settled"
)

// Credit is the credit leg of a transfer: pending until the destination account's shard has
// written it. A transfer between two accounts of one shard is settled at once.
type Credit struct {
	State CreditState `json:"state"`
	// SettledAt is when the credit committed on the destination's shard; zero unless State is
	// CreditSettled.
	SettledAt time.Time `json:"settled_at,omitzero"`
}

// Receipt is the server's answer to an applied transfer.
type Receipt struct {
	Transfer TransferRecord
	// Replayed is true when the answer is the one the server stored for an earlier attempt
	// with this key (Idempotent-Replayed: true): the transfer was applied once, earlier —
	// perhaps by an attempt whose answer was lost. It is a success like any other.
	Replayed bool
	// Location is the transfer's URL path, /transfers/{id}.
	Location string
	// Status is the HTTP status of the answer (201).
	Status int
	// Attempts is how many attempts this call made.
	Attempts int
}

// Send applies t, retrying as described in the package documentation, and returns the
// server's receipt. An error is [ErrNoKey] or another problem with t's key (nothing was sent),
// a [*Problem] (the server refused the transfer; [ErrKeyReused] and [ErrKeyExpired] match it
// with errors.Is), or an [*UnknownOutcomeError]: keep t and send it again later.
func (c *Client) Send(ctx context.Context, t Transfer) (*Receipt, error) {
	if err := checkKey(t.Key); err != nil {
		return nil, err
	}
	rep, err := c.do(ctx, call{
		method: http.MethodPost, path: "/transfers", body: t.body(), key: t.Key,
		answers: []int{http.StatusCreated, http.StatusOK},
	})
	if err != nil {
		return nil, err
	}
	rc := &Receipt{
		Replayed: rep.header.Get("Idempotent-Replayed") == "true",
		Location: rep.header.Get("Location"),
		Status:   rep.status,
		Attempts: rep.tries,
	}
	if err := json.Unmarshal(rep.body, &rc.Transfer); err != nil {
		return rc, fmt.Errorf("shardgate: the transfer with Idempotency-Key %q was applied (%d, Location %q) but its description could not be decoded: %w", t.Key, rep.status, rc.Location, err)
	}
	return rc, nil
}
