package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Outcome is what the shard did with one transfer attempt.
type Outcome string

// The outcomes of Transfer, as the transfer functions (shardgate_apply_rows, shardgate_apply_batch) name them.
const (
	Applied    Outcome = "applied"     // debit and completed record written
	Replayed   Outcome = "replayed"    // an earlier attempt completed; Result.Response is its response
	KeyReused  Outcome = "key_reused"  // the key belongs to a different request
	InProgress Outcome = "in_progress" // the same request is in flight elsewhere
	Expired    Outcome = "expired"     // applied longer ago than retention; the record has been dropped
	// RecordMissing: the debit is in the ledger, younger than retention, but its record is not
	// to be found (its partition detached by hand, say). Nothing was written; the stored
	// response may come back, so the answer must be retryable, never a final "expired".
	RecordMissing Outcome = "record_missing"
	NotOwner      Outcome = "not_owner" // this shard does not own the keyspace id
)

// Response is an HTTP response exactly as first sent, stored with the claim so that a retry can
// be answered byte for byte. Body is kept as a JSON string inside the jsonb column, which
// preserves it exactly (jsonb would reorder the keys of an embedded object).
type Response struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

// Kind is which leg of a transfer an attempt writes.
type Kind string

// The two legs of a transfer, as ledger_entries.kind names them.
const (
	Debit  Kind = "transfer_out" // on the shard that owns Src
	Credit Kind = "transfer_in"  // on the shard that owns Dst, delivered by the relay
)

// TransferRequest is one attempt to apply one leg of a transfer on the shard that owns that
// leg's account: Src for a debit, Dst for a credit.
type TransferRequest struct {
	Kind        Kind   // Debit when empty
	Scope       string // client and operation, e.g. "payments-api:transfer"
	Key         string // the Idempotency-Key as the client sent it (unquoted)
	RequestHash string // fingerprint of method, path and canonical body
	KeyspaceID  uint64 // keyspace id of the leg's account, checked against the shard's owned ranges
	// DstKeyspaceID is a debit's keyspace id of Dst: when the debit's shard owns it too, the
	// credit is written in the debit's transaction instead of being owed. Unused for a credit.
	DstKeyspaceID uint64
	TransferID    string
	Client        string
	Src, Dst      int64
	Amount        int64
	Currency      string
	Reference     string // empty means none
	Response      Response
	// Retention is how long keys are kept: the shard concludes Expired only for a debit older
	// than this, and RecordMissing for a younger one without its record.
	Retention time.Duration
}

// TransferResult reports what happened. Response is set for Applied (the response to send) and
// Replayed (the stored one). ShardMapVersion is set for NotOwner. CreditSettled is set for an
// Applied debit whose credit was written in the same transaction (its shard owns Dst); an
// Applied debit without it left the credit owed, for the relay to deliver.
type TransferResult struct {
	Outcome         Outcome
	Response        Response
	ShardMapVersion int64
	CreditSettled   bool
}

// ErrNoPartition means the idempotency_record partition for the current time does not exist, so
// nothing could be stored. Nothing was written; partition upkeep (router maintain) fixes it.
var ErrNoPartition = errors.New("idempotency_record has no partition for the current time; run `router maintain`")

// Transfer runs one attempt on pool, the owning shard's pool: a group of one, in one statement,
// one round trip and one implicit transaction. An error means the outcome is not known to this
// process (the shard was unreachable, timed out, or failed mid-statement); the caller must answer
// with a retryable status and must not store anything elsewhere. Retrying with the same key is
// safe whatever happened on the shard.
func Transfer(ctx context.Context, pool *pgxpool.Pool, r TransferRequest) (TransferResult, error) {
	res, err := TransferBatch(ctx, pool, []TransferRequest{r})
	if err != nil {
		return TransferResult{}, err
	}
	return res[0], nil
}

// transferError tells a missing partition (the record's insert found no partition for now, so
// the statement rolled back) from any other failure.
func transferError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.TableName == "idempotency_record" {
		return fmt.Errorf("%w: %w", ErrNoPartition, pgErr)
	}
	return err
}

// decodeOutcome turns one row of the transfer functions into a result; an outcome outside the
// closed set is an error.
func decodeOutcome(r TransferRequest, outcome string, stored []byte, mapVersion *int64, creditSettled *bool) (TransferResult, error) {
	res := TransferResult{Outcome: Outcome(outcome)}
	switch res.Outcome {
	case Applied:
		res.Response = r.Response
		res.CreditSettled = creditSettled != nil && *creditSettled
	case Replayed:
		if err := json.Unmarshal(stored, &res.Response); err != nil {
			return TransferResult{}, fmt.Errorf("decode stored response for key in scope %q: %w", r.Scope, err)
		}
	case NotOwner:
		if mapVersion != nil {
			res.ShardMapVersion = *mapVersion
		}
	case KeyReused, InProgress, Expired, RecordMissing:
	default:
		return TransferResult{}, fmt.Errorf("shardgate transfer function returned unknown outcome %q", outcome)
	}
	return res, nil
}

// The two functions that run a group, with one contract: shardgate_apply_rows works item by
// item, shardgate_apply_batch set-wise.
const (
	applyRows  = "shardgate_apply_rows"
	applyBatch = "shardgate_apply_batch"
)

// setWiseFrom is the smallest group that TransferBatch sends set-wise: from here a group costs
// less per item through shardgate_apply_batch (BenchmarkGroupFunctions: since migration 0005 the
// two functions cost the same at three items, and the set-wise one 5-25% less from four).
const setWiseFrom = 4

// groupSQL is a whole group through fn: one statement, one round trip, one commit.
func groupSQL(fn string) string {
	return `SELECT idx, outcome, stored_response, shard_map_version, credit_settled
FROM ` + fn + `($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`
}

var (
	rowsSQL  = groupSQL(applyRows)
	batchSQL = groupSQL(applyBatch)
)

// TransferBatch runs a group of attempts on pool, the shard's pool, in one statement and one
// transaction (group commit): each item gets the outcome a lone Transfer would give it, except
// that of two attempts of one key in the group the later is in flight (in_progress, or
// key_reused for another request) until the group commits. Items may carry different retentions
// only in theory: the group is judged with the first item's. An error means nothing of the
// group committed when it is a *pgconn.PgError (the statement failed; each item may then be
// sent alone), and that the outcome is unknown otherwise (the connection failed or timed out).
func TransferBatch(ctx context.Context, pool *pgxpool.Pool, reqs []TransferRequest) ([]TransferResult, error) {
	q := rowsSQL
	if len(reqs) >= setWiseFrom {
		q = batchSQL
	}
	return transferGroup(ctx, pool, reqs, q)
}

// transferGroup runs reqs as one statement q, one of the group functions.
func transferGroup(ctx context.Context, pool *pgxpool.Pool, reqs []TransferRequest, q string) ([]TransferResult, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	args, err := batchArgs(reqs)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, q, args...)
	if err != nil {
		return nil, transferError(err)
	}
	results := make([]TransferResult, len(reqs))
	seen := 0
	var (
		idx        int
		outcome    string
		stored     []byte
		mapVersion *int64
		settled    *bool
	)
	_, err = pgx.ForEachRow(rows, []any{&idx, &outcome, &stored, &mapVersion, &settled}, func() error {
		if idx < 1 || idx > len(reqs) {
			return fmt.Errorf("a group function returned item %d of %d", idx, len(reqs))
		}
		res, err := decodeOutcome(reqs[idx-1], outcome, stored, mapVersion, settled)
		results[idx-1] = res
		seen++
		return err
	})
	if err != nil {
		return nil, transferError(err)
	}
	if seen != len(reqs) {
		return nil, fmt.Errorf("a group function answered %d of %d items", seen, len(reqs))
	}
	return results, nil
}

// batchArgs are the parallel arrays of shardgate_apply_batch, in its parameter order. A debit's
// account is Src and its counterparty Dst; a credit's are the other way round.
func batchArgs(reqs []TransferRequest) ([]any, error) {
	n := len(reqs)
	kinds, scopes, keys, hashes, ids := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	clients, currencies, responses := make([]string, n), make([]string, n), make([]string, n)
	keyspaces, accounts, counterparties, amounts := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	counterKeyspaces := make([]*int64, n)
	references := make([]*string, n)
	for i := range reqs {
		r := &reqs[i]
		resp, err := json.Marshal(r.Response)
		if err != nil {
			return nil, fmt.Errorf("encode response: %w", err)
		}
		switch r.Kind {
		case Debit, "":
			kinds[i], accounts[i], counterparties[i] = string(Debit), r.Src, r.Dst
			ks := signedKeyspace(r.DstKeyspaceID)
			counterKeyspaces[i] = &ks
		case Credit:
			kinds[i], accounts[i], counterparties[i] = string(Credit), r.Dst, r.Src
		default:
			return nil, fmt.Errorf("transfer leg of unknown kind %q", r.Kind)
		}
		scopes[i], keys[i], hashes[i], ids[i] = r.Scope, r.Key, r.RequestHash, r.TransferID
		clients[i], currencies[i], responses[i] = r.Client, r.Currency, string(resp)
		keyspaces[i], amounts[i] = signedKeyspace(r.KeyspaceID), r.Amount
		if r.Reference != "" {
			references[i] = &r.Reference
		}
	}
	return []any{kinds, scopes, keys, hashes, keyspaces, ids, clients, accounts, counterparties, counterKeyspaces,
		amounts, currencies, references, responses, reqs[0].Retention}, nil
}

// signedKeyspace maps an unsigned keyspace id onto a signed bigint with the same order, by
// flipping the sign bit: 0 becomes math.MinInt64 and 1<<63 becomes 0.
func signedKeyspace(id uint64) int64 {
	return int64(id ^ (1 << 63))
}
