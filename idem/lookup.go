package idem

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// LedgerTransfer is a transfer as read back from the ledger.
type LedgerTransfer struct {
	TransferID string
	Src, Dst   int64
	Amount     int64
	Currency   string
	Reference  string
	CreatedAt  time.Time
}

// ErrNotFound means no such transfer exists for the asking client.
var ErrNotFound = errors.New("transfer not found")

// GetTransfer reads the debit of transfer id made by client. Another client's transfer is
// ErrNotFound, exactly like a missing one, so its existence is not revealed.
func GetTransfer(ctx context.Context, pool *pgxpool.Pool, id, client string) (LedgerTransfer, error) {
	t := LedgerTransfer{TransferID: id}
	var ref *string
	err := pool.QueryRow(ctx, `SELECT account_id, counterparty_id, amount, currency, reference, created_at
		FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_out' AND client = $2`, id, client).
		Scan(&t.Src, &t.Dst, &t.Amount, &t.Currency, &ref, &t.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, ErrNotFound
	}
	if ref != nil {
		t.Reference = *ref
	}
	return t, err
}
