package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Outcome is what the shard did with one transfer attempt.
type Outcome string

// The outcomes of Transfer, as shardgate_transfer names them.
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

// TransferRequest is one attempt to apply a transfer on the shard that owns its source account.
type TransferRequest struct {
	Scope       string // client and operation, e.g. "payments-api:transfer"
	Key         string // the Idempotency-Key as the client sent it (unquoted)
	RequestHash string // fingerprint of method, path and canonical body
	KeyspaceID  uint64 // keyspace id of Src, checked against the shard's owned ranges
	TransferID  string
	Client      string
	Src, Dst    int64
	Amount      int64
	Currency    string
	Reference   string // empty means none
	Response    Response
	// Retention is how long keys are kept: the shard concludes Expired only for a debit older
	// than this, and RecordMissing for a younger one without its record.
	Retention time.Duration
}

// TransferResult reports what happened. Response is set for Applied (the response to send) and
// Replayed (the stored one). ShardMapVersion is set for NotOwner.
type TransferResult struct {
	Outcome         Outcome
	Response        Response
	ShardMapVersion int64
}

// ErrNoPartition means the idempotency_record partition for the current time does not exist, so
// nothing could be stored. Nothing was written; partition upkeep (router maintain) fixes it.
var ErrNoPartition = errors.New("idempotency_record has no partition for the current time; run `router maintain`")

// transferSQL is the whole transfer: one statement, one round trip, one implicit transaction.
const transferSQL = `SELECT outcome, stored_response, shard_map_version
FROM shardgate_transfer($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)`

// Transfer runs one attempt on pool, the owning shard's pool. An error means the outcome is not
// known to this process (the shard was unreachable, timed out, or failed mid-statement); the
// caller must answer with a retryable status and must not store anything elsewhere. Retrying
// with the same key is safe whatever happened on the shard.
func Transfer(ctx context.Context, pool *pgxpool.Pool, r TransferRequest) (TransferResult, error) {
	resp, err := json.Marshal(r.Response)
	if err != nil {
		return TransferResult{}, fmt.Errorf("encode response: %w", err)
	}
	var reference *string
	if r.Reference != "" {
		reference = &r.Reference
	}
	var (
		outcome    string
		stored     []byte
		mapVersion *int64
	)
	err = pool.QueryRow(ctx, transferSQL,
		r.Scope, r.Key, r.RequestHash, signedKeyspace(r.KeyspaceID),
		r.TransferID, r.Client, r.Src, r.Dst, r.Amount,
		r.Currency, reference, string(resp), r.Retention,
	).Scan(&outcome, &stored, &mapVersion)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23514" && pgErr.TableName == "idempotency_record" {
			return TransferResult{}, fmt.Errorf("%w: %s", ErrNoPartition, pgErr.Message)
		}
		return TransferResult{}, err
	}
	res := TransferResult{Outcome: Outcome(outcome)}
	switch res.Outcome {
	case Applied:
		res.Response = r.Response
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
		return TransferResult{}, fmt.Errorf("shardgate_transfer returned unknown outcome %q", outcome)
	}
	return res, nil
}

// signedKeyspace maps an unsigned keyspace id onto a signed bigint with the same order, by
// flipping the sign bit: 0 becomes math.MinInt64 and 1<<63 becomes 0.
func signedKeyspace(id uint64) int64 {
	return int64(id ^ (1 << 63))
}
