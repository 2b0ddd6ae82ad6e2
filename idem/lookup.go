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
	// Credit is pending or settled as the debit's shard knows it, or unknown when it holds no
	// owed-credit row (then dst's shard tells: CreditSettledAt).
	Credit    CreditState
	SettledAt time.Time // when Credit is settled
}

// ErrNotFound means no such transfer exists for the asking client.
var ErrNotFound = errors.New("transfer not found")

// GetTransfer reads the debit of transfer id made by client. Another client's transfer is
// ErrNotFound, exactly like a missing one, so its existence is not revealed.
func GetTransfer(ctx context.Context, pool *pgxpool.Pool, id, client string) (LedgerTransfer, error) {
	t := LedgerTransfer{TransferID: id}
	var (
		ref       *string
		owed      bool
		settledAt *time.Time
	)
	err := pool.QueryRow(ctx, `SELECT d.account_id, d.counterparty_id, d.amount, d.currency, d.reference, d.created_at,
			o.transfer_id IS NOT NULL, coalesce(o.settled_at, c.created_at)
		FROM ledger_entries d
		LEFT JOIN shardgate_credit_outbox o ON o.transfer_id = d.transfer_id
		LEFT JOIN ledger_entries c ON c.transfer_id = d.transfer_id AND c.kind = 'transfer_in'
		WHERE d.transfer_id = $1 AND d.kind = 'transfer_out' AND d.client = $2`, id, client).
		Scan(&t.Src, &t.Dst, &t.Amount, &t.Currency, &ref, &t.CreatedAt, &owed, &settledAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return t, ErrNotFound
	}
	if ref != nil {
		t.Reference = *ref
	}
	switch {
	case settledAt != nil:
		t.Credit, t.SettledAt = CreditSettled, *settledAt
	case owed:
		t.Credit = CreditPending
	default:
		t.Credit = CreditUnknown
	}
	return t, err
}
