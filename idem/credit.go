package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// CreditScope is the idempotency scope of credits delivered by the relay; their key is the
// transfer id. Client scopes end in ":transfer", so no client can use it.
const CreditScope = "shardgate:credit"

// OwedCredit is a credit its debit's shard owes: a row of shardgate_credit_outbox claimed by a
// relay.
type OwedCredit struct {
	TransferID string
	Src, Dst   int64
	Amount     int64
	Currency   string
	Reference  string
	Client     string
	DebitedAt  time.Time
	Attempts   int // deliveries tried, this one included
	// TakenOver is true when the row was leased by another relay whose lease ran out before it
	// settled the credit (that relay died or stalled).
	TakenOver bool
}

// CreditRequest is the credit leg of c as a transfer attempt on the shard that owns c.Dst,
// whose keyspace id is dstKeyspace: same transfer id, key derived from it, and a request hash
// over everything the credit writes, so a redelivery replays and a different credit under the
// same id is key_reused.
func CreditRequest(c OwedCredit, dstKeyspace uint64, retention time.Duration) TransferRequest {
	h := sha256.New()
	for _, f := range []string{c.TransferID, strconv.FormatInt(c.Src, 10), strconv.FormatInt(c.Dst, 10),
		strconv.FormatInt(c.Amount, 10), c.Currency, c.Reference, c.Client} {
		h.Write([]byte(f))
		h.Write([]byte{0})
	}
	return TransferRequest{
		Kind: Credit, Scope: CreditScope, Key: c.TransferID, RequestHash: hex.EncodeToString(h.Sum(nil)),
		KeyspaceID: dstKeyspace, TransferID: c.TransferID, Client: c.Client,
		Src: c.Src, Dst: c.Dst, Amount: c.Amount, Currency: c.Currency, Reference: c.Reference,
		Response: Response{Status: 201}, Retention: retention,
	}
}

// ClaimCredits leases up to limit owed credits that are due, for lease, to owner. Only rows of
// the shard's active ranges are claimed (a moving range's rows are its new owner's to deliver);
// rows another relay is delivering (locked now, or leased and not expired) are skipped, so many
// relays can claim side by side.
func ClaimCredits(ctx context.Context, pool *pgxpool.Pool, owner string, limit int, lease time.Duration) ([]OwedCredit, error) {
	rows, err := pool.Query(ctx, `WITH due AS (
		SELECT o.transfer_id, o.lease_owner IS NOT NULL AND o.lease_owner <> $2 AS taken_over
		  FROM shardgate_credit_outbox o
		 WHERE o.settled_at IS NULL AND o.next_attempt_at <= now()
		   AND (o.lease_until IS NULL OR o.lease_until < now())
		   AND EXISTS (SELECT 1 FROM shardgate_owned_range r
		                WHERE r.active AND o.keyspace_id >= r.lo AND (r.hi IS NULL OR o.keyspace_id < r.hi))
		 ORDER BY o.next_attempt_at
		 LIMIT $1
		 FOR UPDATE OF o SKIP LOCKED)
	UPDATE shardgate_credit_outbox o
	   SET lease_owner = $2, lease_until = now() + $3::interval, attempts = o.attempts + 1
	  FROM due WHERE o.transfer_id = due.transfer_id
	RETURNING o.transfer_id, o.src, o.dst, o.amount, o.currency, coalesce(o.reference, ''), o.client, o.debited_at,
	          o.attempts, due.taken_over`, limit, owner, lease)
	if err != nil {
		return nil, err
	}
	var out []OwedCredit
	var c OwedCredit
	_, err = pgx.ForEachRow(rows, []any{&c.TransferID, &c.Src, &c.Dst, &c.Amount, &c.Currency, &c.Reference, &c.Client,
		&c.DebitedAt, &c.Attempts, &c.TakenOver}, func() error {
		out = append(out, c)
		return nil
	})
	return out, err
}

// SettleCredits marks owed credits settled, each at the time its credit was written on dst's
// shard, without waiting for the flush of its commit (settleLazily). It is done only once the
// credit is known to be there; a row settled already stays as it is.
func SettleCredits(ctx context.Context, pool *pgxpool.Pool, settledAt map[string]time.Time) error {
	if len(settledAt) == 0 {
		return nil
	}
	ids, times := make([]string, 0, len(settledAt)), make([]time.Time, 0, len(settledAt))
	for id, at := range settledAt {
		ids, times = append(ids, id), append(times, at)
	}
	_, err := pool.Exec(ctx, `WITH `+settleLazily+`
		UPDATE shardgate_credit_outbox o
		   SET settled_at = s.at, lease_owner = NULL, lease_until = NULL, last_error = NULL
		  FROM unnest($1::text[], $2::timestamptz[]) AS s(id, at), lazily
		 WHERE o.transfer_id = s.id AND o.settled_at IS NULL`, ids, times)
	return err
}

// settleLazily is a CTE, lazily, that makes its statement's commit not wait for the WAL flush
// (synchronous_commit off for that transaction alone). A settle may be lost in a crash or a
// failover of its shard: the credit is in dst's ledger already, so the row stays owed, its lease
// runs out, and the next delivery replays and settles it again. Nothing waits on that flush, and
// the shard folds it into the next one that another commit waits for.
const settleLazily = `lazily AS (SELECT set_config('synchronous_commit', 'off', true))`

// SettleDelivered marks owed credits settled at the time of this statement on their debit's
// shard, which runs after their credits committed on dst's shard: the handoff's settle, which
// knows each credit landed from its own delivery and does not read dst's ledger back. Like
// SettleCredits it does not wait for its commit's flush, and leaves a row settled already as it
// is.
func SettleDelivered(ctx context.Context, pool *pgxpool.Pool, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := pool.Exec(ctx, `WITH `+settleLazily+`
		UPDATE shardgate_credit_outbox o
		   SET settled_at = now(), lease_owner = NULL, lease_until = NULL, last_error = NULL
		  FROM lazily
		 WHERE o.transfer_id = ANY($1) AND o.settled_at IS NULL`, ids)
	return err
}

// CreditLeaseSettings are the session settings with which a router's connections write the
// owed credits of its debits leased to owner for lease (shardgate_credit_lease), for a relay
// that delivers them itself at once. A connection opened with them must belong to a router
// whose relay does so: until the lease runs out, no other relay claims those credits.
func CreditLeaseSettings(owner string, lease time.Duration) map[string]string {
	return map[string]string{
		"shardgate.credit_lease_owner": owner,
		"shardgate.credit_lease":       strconv.FormatInt(lease.Microseconds(), 10) + " microseconds",
	}
}

// Backoff is how long a failed delivery waits: Base doubled per attempt, at most Max, scaled by
// a random factor in [0.5, 1.5) so that relays do not retry in step.
type Backoff struct{ Base, Max time.Duration }

// DeferCredits gives up owner's lease on credits whose delivery failed with reason, and makes
// each due again after its backoff. A row another relay has taken over meanwhile is left alone.
func DeferCredits(ctx context.Context, pool *pgxpool.Pool, owner string, ids []string, reason string, b Backoff) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := pool.Exec(ctx, `UPDATE shardgate_credit_outbox
		   SET lease_owner = NULL, lease_until = NULL, last_error = left($3, 500),
		       next_attempt_at = now() + least($5::interval, $4::interval * power(2, least(attempts - 1, 30))) * (0.5 + random())
		 WHERE transfer_id = ANY($1) AND lease_owner = $2 AND settled_at IS NULL`, ids, owner, reason, b.Base, b.Max)
	return err
}

// CreditTimes returns, of the transfer ids given, those whose credit is in the ledger of the
// shard behind pool, with the time it was written.
func CreditTimes(ctx context.Context, pool *pgxpool.Pool, ids []string) (map[string]time.Time, error) {
	rows, err := pool.Query(ctx, `SELECT transfer_id, created_at FROM ledger_entries
		WHERE kind = 'transfer_in' AND transfer_id = ANY($1)`, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]time.Time, len(ids))
	var (
		id string
		at time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &at}, func() error {
		out[id] = at
		return nil
	})
	return out, err
}

// OwedStats reports the credits the shard owes (pending rows of its active ranges) and when the
// oldest of them was debited (zero when none is owed).
func OwedStats(ctx context.Context, pool *pgxpool.Pool) (owed int64, oldest time.Time, err error) {
	var at *time.Time
	err = pool.QueryRow(ctx, `SELECT count(*), min(o.debited_at) FROM shardgate_credit_outbox o
		WHERE o.settled_at IS NULL AND EXISTS (SELECT 1 FROM shardgate_owned_range r
		      WHERE r.active AND o.keyspace_id >= r.lo AND (r.hi IS NULL OR o.keyspace_id < r.hi))`).Scan(&owed, &at)
	if at != nil {
		oldest = *at
	}
	return owed, oldest, err
}

// ClearSettled deletes owed-credit rows settled longer ago than keep, and returns how many.
// The credit itself stays in its shard's ledger, which is what a transfer's status reads then.
func ClearSettled(ctx context.Context, pool *pgxpool.Pool, keep time.Duration) (int64, error) {
	tag, err := pool.Exec(ctx, `DELETE FROM shardgate_credit_outbox WHERE settled_at < now() - $1::interval`, keep)
	return tag.RowsAffected(), err
}

// CreditState is where a transfer's credit stands.
type CreditState string

// The states of a credit.
const (
	CreditPending CreditState = "pending" // the debit applied; the credit is owed
	CreditSettled CreditState = "settled" // the credit is in dst's ledger
	// CreditUnknown: the debit's shard holds no owed-credit row (settled and cleared, or written
	// with the debit); only dst's shard can tell.
	CreditUnknown CreditState = "unknown"
)

// CreditSettledAt reads, on the shard behind pool, when the credit of transfer id was written;
// ok is false when that shard has no such credit.
func CreditSettledAt(ctx context.Context, pool *pgxpool.Pool, id string) (at time.Time, ok bool, err error) {
	err = pool.QueryRow(ctx, `SELECT created_at FROM ledger_entries WHERE transfer_id = $1 AND kind = 'transfer_in'`, id).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	return at, err == nil, err
}

// CurrencyBalance is an account's position in one currency on its own shard.
type CurrencyBalance struct {
	Currency string
	Credits  int64 // sum of the account's transfer_in rows
	Debits   int64 // sum of its transfer_out rows
	// PendingOut is the part of Debits whose credit to the counterparty is still owed. Credits
	// owed to this account are owed by other shards and are not in Credits until they arrive.
	PendingOut int64
}

// ErrNotOwned means the shard does not own the account's keyspace id (any more): its rows are
// elsewhere, or moving.
var ErrNotOwned = errors.New("this shard does not own the account")

// Balance reads account's balance per currency on the shard behind pool, which must own
// keyspace, the account's keyspace id; both legs of every transfer touching the account live
// there. One statement, so one round trip and one snapshot for the ownership check and the sums.
func Balance(ctx context.Context, pool *pgxpool.Pool, account int64, keyspace uint64) ([]CurrencyBalance, int64, error) {
	rows, err := pool.Query(ctx, `WITH s AS (
			SELECT (SELECT map_version FROM shardgate_shard) AS version,
			       EXISTS (SELECT 1 FROM shardgate_owned_range WHERE active AND lo <= $2 AND (hi IS NULL OR $2 < hi)) AS owned),
		legs AS (
			SELECT currency, CASE kind WHEN 'transfer_in' THEN amount ELSE 0 END AS credits,
			       CASE kind WHEN 'transfer_out' THEN amount ELSE 0 END AS debits, 0 AS pending
			  FROM ledger_entries WHERE account_id = $1 AND keyspace_id = $2
			UNION ALL
			SELECT currency, 0, 0, amount FROM shardgate_credit_outbox WHERE src = $1 AND keyspace_id = $2 AND settled_at IS NULL),
		t AS (
			SELECT currency, sum(credits)::bigint AS credits, sum(debits)::bigint AS debits, sum(pending)::bigint AS pending
			  FROM legs GROUP BY currency)
		SELECT s.version, s.owned, t.currency, coalesce(t.credits, 0), coalesce(t.debits, 0), coalesce(t.pending, 0)
		  FROM s LEFT JOIN t ON s.owned ORDER BY t.currency`, account, signedKeyspace(keyspace))
	if err != nil {
		return nil, 0, err
	}
	var (
		out      []CurrencyBalance
		version  int64
		owned    bool
		currency *string
		b        CurrencyBalance
	)
	_, err = pgx.ForEachRow(rows, []any{&version, &owned, &currency, &b.Credits, &b.Debits, &b.PendingOut}, func() error {
		if currency != nil {
			b.Currency = *currency
			out = append(out, b)
		}
		return nil
	})
	if err == nil && !owned {
		err = fmt.Errorf("%w (shard map version %d)", ErrNotOwned, version)
	}
	return out, version, err
}

// UpgradeSweepGrace is how long after migration 0004 SweepUpgradeWindow waits: longer than any
// statement of a router of the previous release can still be running (its lock_timeout and
// request timeout are seconds).
const UpgradeSweepGrace = 10 * time.Minute

// SweepUpgradeWindow makes owed, once per shard, the credits of debits that routers of the
// previous release wrote while migration 0004 ran: their old function body recorded no owed
// credit, and the migration's backfill could not see a debit not yet committed. It looks at the
// debits from an hour before the migration on that have neither their credit on this shard nor
// an owed row, once grace has passed since the migration, and then never again. It returns how
// many credits it made owed and whether it ran. It reads the ledger by time once (a sequential
// scan on a large ledger).
func SweepUpgradeWindow(ctx context.Context, pool *pgxpool.Pool, grace time.Duration) (owed int64, ran bool, err error) {
	err = pool.QueryRow(ctx, `WITH s AS (
		SELECT since FROM shardgate_credit_sweep WHERE done_at IS NULL AND now() >= since + $1::interval FOR UPDATE),
	ins AS (
		INSERT INTO shardgate_credit_outbox (transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at)
		SELECT d.transfer_id, d.keyspace_id, d.account_id, d.counterparty_id, d.amount, d.currency, d.reference, d.client, d.created_at
		  FROM ledger_entries d, s
		 WHERE d.kind = 'transfer_out' AND d.created_at >= s.since - interval '1 hour'
		   AND NOT EXISTS (SELECT 1 FROM ledger_entries c WHERE c.transfer_id = d.transfer_id AND c.kind = 'transfer_in')
		ON CONFLICT (transfer_id) DO NOTHING
		RETURNING 1),
	done AS (
		UPDATE shardgate_credit_sweep SET done_at = now() FROM s RETURNING 1)
	SELECT (SELECT count(*) FROM ins), EXISTS (SELECT 1 FROM done)`, grace).Scan(&owed, &ran)
	return owed, ran, err
}
