package rangemove

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
)

// cursor is a row's place in its table's keyspace index: keyspace_id, then the table's keys
// (one or two). The bulk copy goes on after the last row it copied.
type cursor struct {
	KS   int64
	A, B string
}

// tableCopy says how one of the tables a range owns is copied: which columns are staged on the
// destination (moving_rows), which keys order a batch after keyspace_id (its keyspace index), how
// a change names a row, and how staged rows are written.
type tableCopy struct {
	stage  string // its stage in shardgate_range_move, and its tbl in shardgate_range_change
	table  string
	cols   string // staged columns; the first ones after keyspace_id name the row's place
	keys   []string
	casts  []string // of the cursor's A and B in SQL
	match  string   // joins t to c(a, b), the rows named by changes
	batch  int
	place  func(raw [][]byte) cursor // from a row's columns in binary format
	insert func(ctx context.Context, tx pgx.Tx, mv *MoveReport) error
}

const (
	recordCols = "key, scope, request_hash, keyspace_id, response, state, created_at"
	ledgerCols = "transfer_id, keyspace_id, account_id, counterparty_id, amount, currency, kind, reference, client, created_at"
	// The owed credits of the range's debits, with their delivery state and lease: a relay of
	// the old owner may be delivering one, and the new owner's relay waits out its lease.
	outboxCols = "transfer_id, keyspace_id, src, dst, amount, currency, reference, client, debited_at, settled_at, attempts, next_attempt_at, lease_owner, lease_until, last_error"
	inRange    = "keyspace_id >= $1 AND ($2::bigint IS NULL OR keyspace_id < $2)"
)

// copyBatch is how many idempotency records are copied per transaction: each holds its key's
// advisory lock until commit, and the lock table is shared by the whole server. Ledger rows and
// owed credits take no such lock and go in larger batches. Both are small because a batch is a
// burst of work beside the shards' transfers, and its commit a burst of WAL: at 500 and 2,000
// the other ranges' p99 up to the grant of a 1,000,000-transfer move was 13.8–17.8 ms, at 250
// and 500 it was 11.5 ms, for a copy 5% slower (docs/operations.md).
const (
	copyBatch = 250
	rowBatch  = 500
)

var tables = []tableCopy{
	{
		stage: "records", table: "idempotency_record", cols: recordCols,
		keys: []string{"scope", "key"}, casts: []string{"text", "text"},
		match: "t.scope = c.a AND t.key = c.b", batch: copyBatch,
		place: func(v [][]byte) cursor { return cursor{KS: int8At(v[3]), A: string(v[1]), B: string(v[0])} },
		insert: func(ctx context.Context, tx pgx.Tx, mv *MoveReport) error {
			var inserted, conflicts int64
			if err := tx.QueryRow(ctx, "SELECT inserted, conflicts FROM shardgate_copy_records()").Scan(&inserted, &conflicts); err != nil {
				return err
			}
			mv.Records += inserted
			mv.Conflicts += conflicts
			return nil
		},
	},
	{
		// Ledger rows: their unique (transfer_id, kind) settles any race. id, the source's, only
		// orders the batches: the destination numbers its rows itself.
		stage: "ledger", table: "ledger_entries", cols: "id, " + ledgerCols,
		keys: []string{"id"}, casts: []string{"bigint"},
		match: "t.transfer_id = c.a AND t.kind = c.b", batch: rowBatch,
		place: func(v [][]byte) cursor { return cursor{KS: int8At(v[2]), A: strconv.FormatInt(int8At(v[0]), 10)} },
		insert: func(ctx context.Context, tx pgx.Tx, mv *MoveReport) error {
			tag, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO ledger_entries (%[1]s) SELECT %[1]s FROM moving_rows ON CONFLICT (transfer_id, kind) DO NOTHING", ledgerCols))
			mv.Ledger += tag.RowsAffected()
			return err
		},
	},
	{
		// Owed credits: the source's state wins, but a credit settled on either side stays
		// settled (delivering it again would only replay).
		stage: "outbox", table: "shardgate_credit_outbox", cols: outboxCols,
		keys: []string{"transfer_id"}, casts: []string{"text"},
		match: "t.transfer_id = c.a", batch: rowBatch,
		place: func(v [][]byte) cursor { return cursor{KS: int8At(v[1]), A: string(v[0])} },
		insert: func(ctx context.Context, tx pgx.Tx, mv *MoveReport) error {
			tag, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO shardgate_credit_outbox AS o (%[1]s) SELECT %[1]s FROM moving_rows
				ON CONFLICT (transfer_id) DO UPDATE SET settled_at = coalesce(o.settled_at, EXCLUDED.settled_at),
					attempts = greatest(o.attempts, EXCLUDED.attempts), next_attempt_at = EXCLUDED.next_attempt_at,
					lease_owner = EXCLUDED.lease_owner, lease_until = EXCLUDED.lease_until, last_error = EXCLUDED.last_error`, outboxCols))
			mv.Credits += tag.RowsAffected()
			return err
		},
	},
}

// batchQuery selects the next batch of t's rows in r after c (from the first when c is nil), in
// keyspace index order.
func (t *tableCopy) batchQuery(lo int64, hi *int64, c *cursor) (string, []any) {
	q := fmt.Sprintf("SELECT %s FROM %s WHERE %s", t.cols, t.table, inRange)
	args := []any{lo, hi}
	order := "keyspace_id, " + strings.Join(t.keys, ", ")
	if c != nil {
		params := []string{"$3"}
		args = append(args, c.KS, c.A)
		params = append(params, "$4::"+t.casts[0])
		if len(t.keys) > 1 {
			args = append(args, c.B)
			params = append(params, "$5::"+t.casts[1])
		}
		q += fmt.Sprintf(" AND (%s) > (%s)", order, strings.Join(params, ", "))
	}
	return q + fmt.Sprintf(" ORDER BY %s LIMIT %d", order, t.batch), args
}

// readBatch reads the next batch of t's rows in r after c (from the first when c is nil) from
// src.
func (t *tableCopy) readBatch(ctx context.Context, src *pgxpool.Pool, r shardmap.KeyRange, c *cursor) (fetched, error) {
	lo, hi := idem.Bounds(r)
	q, args := t.batchQuery(lo, hi, c)
	return readRows(ctx, src, q, args, t.place)
}

// copyAll copies every row of t in r from src to dst, a batch per transaction, starting after
// c (from the first when nil). after, unless nil, is called with each batch's last place once
// the batch is committed on dst. done is true, and nothing is copied, when dst already serves
// part of r (see writeRows).
//
// The next batch is read from src while this one is written to dst: the two shards work at
// once, and a batch costs the slower of its read and its write rather than their sum. With a
// pace above 0, each batch is followed by a pause pace times as long as the batch took, from
// the wait for its read to the end of after (idem.Nap): the reader, at most one batch ahead,
// idles through most of it, so the copy takes at least (1+pace) times as long and leaves the shards'
// CPU to transfers for the rest.
func (t *tableCopy) copyAll(parent context.Context, src, dst *pgxpool.Pool, r shardmap.KeyRange, c *cursor, mv *MoveReport, pace float64, after func(n int, last cursor) error) (done bool, err error) {
	ctx, cancel := context.WithCancel(parent)
	batches := make(chan fetched, 1)
	var readErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(batches)
		for {
			b, err := t.readBatch(ctx, src, r, c)
			if err != nil {
				readErr = err
				return
			}
			select {
			case batches <- b:
			case <-ctx.Done():
				return
			}
			if b.rows < t.batch {
				return
			}
			c = &b.last
		}
	})
	defer func() { cancel(); wg.Wait() }()
	began := time.Now()
	for b := range batches {
		if done, err := writeRows(ctx, dst, mv, r, t.table, t.cols, b, func(ctx context.Context, tx pgx.Tx, _ int) error { return t.insert(ctx, tx, mv) }); err != nil || done {
			return done, err
		}
		if b.rows > 0 && after != nil {
			if err := after(b.rows, b.last); err != nil {
				return false, err
			}
		}
		if b.rows == t.batch {
			if err := idem.Nap(ctx, pace, began); err != nil {
				return false, err
			}
		}
		began = time.Now()
	}
	cancel()
	wg.Wait()
	if readErr != nil && parent.Err() == nil {
		return false, fmt.Errorf("shard %s: %w", mv.From, readErr)
	}
	return false, readErr
}

// fetched is rows read from a source shard, as a COPY stream in binary format (the format a
// query's binary results use, so no value is decoded or encoded on the way), with how many
// rows it holds and the last one's place.
type fetched struct {
	copy []byte
	rows int
	last cursor
}

// copySignature opens a binary COPY stream: the signature, no flags, no header extension.
const copySignature = "PGCOPY\n\xff\r\n\x00" + "\x00\x00\x00\x00" + "\x00\x00\x00\x00"

// readRows runs query on src with results in binary format and returns its rows as a COPY
// stream. place, unless nil, says where a row is in its table's keyspace index.
func readRows(ctx context.Context, src *pgxpool.Pool, query string, args []any, place func([][]byte) cursor) (fetched, error) {
	rows, err := src.Query(ctx, query, append([]any{pgx.QueryResultFormats{pgx.BinaryFormatCode}}, args...)...)
	if err != nil {
		return fetched{}, err
	}
	defer rows.Close()
	b := fetched{copy: []byte(copySignature)}
	for rows.Next() {
		raw := rows.RawValues()
		b.copy = binary.BigEndian.AppendUint16(b.copy, uint16(len(raw)))
		for _, v := range raw {
			if v == nil {
				b.copy = binary.BigEndian.AppendUint32(b.copy, math.MaxUint32) // -1: NULL
				continue
			}
			b.copy = binary.BigEndian.AppendUint32(b.copy, uint32(len(v)))
			b.copy = append(b.copy, v...)
		}
		if place != nil {
			b.last = place(raw)
		}
		b.rows++
	}
	b.copy = binary.BigEndian.AppendUint16(b.copy, math.MaxUint16) // -1: the end
	return b, rows.Err()
}

// int8At decodes a bigint in binary format.
func int8At(v []byte) int64 { return int64(binary.BigEndian.Uint64(v)) }

// copyInto copies the rows query returns from src to dst in one transaction (writeRows). done
// is as writeRows's. An error names the shard it came from: mv.From for reading the rows, mv.To
// for the rest.
func copyInto(ctx context.Context, src, dst *pgxpool.Pool, mv *MoveReport, r shardmap.KeyRange, table, cols, query string, args []any,
	insert func(ctx context.Context, tx pgx.Tx, rows int) error) (done bool, err error) {
	b, err := readRows(ctx, src, query, args, nil)
	if err != nil {
		if ctx.Err() == nil {
			err = fmt.Errorf("shard %s: %w", mv.From, err)
		}
		return false, err
	}
	return writeRows(ctx, dst, mv, r, table, cols, b, insert)
}

// writeRows runs one copy transaction on dst: it stages the rows of b in the temporary table
// moving_rows (cols of table), and if any were staged lists r on dst as copied and calls
// insert with their number. done is true, and nothing is copied, when dst already serves part
// of r: an apply run again after its grant, whose copy was made and whose new rows are dst's
// own. An error names mv.To.
func writeRows(ctx context.Context, dst *pgxpool.Pool, mv *MoveReport, r shardmap.KeyRange, table, cols string, b fetched,
	insert func(ctx context.Context, tx pgx.Tx, rows int) error) (done bool, err error) {
	lo, hi := idem.Bounds(r)
	err = pgx.BeginFunc(ctx, dst, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1, $2)", idem.LockClass, idem.LockOwnership); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM shardgate_owned_range
			WHERE active AND ($2::bigint IS NULL OR lo < $2) AND (hi IS NULL OR hi > $1))`, lo, hi).Scan(&done); err != nil || done || b.rows == 0 {
			return err
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE TEMP TABLE moving_rows ON COMMIT DROP AS SELECT %s FROM %s WITH NO DATA", cols, table)); err != nil {
			return err
		}
		if _, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(b.copy), fmt.Sprintf("COPY moving_rows (%s) FROM STDIN (FORMAT binary)", cols)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO shardgate_owned_range (key_range, lo, hi, active, copied) VALUES ($1, $2, $3, false, true)
			ON CONFLICT (key_range) DO NOTHING`, r.String(), lo, hi); err != nil {
			return err
		}
		return insert(ctx, tx, b.rows)
	})
	if err != nil && ctx.Err() == nil {
		err = fmt.Errorf("shard %s: %w", mv.To, err)
	}
	return done, err
}

func splitCols(cols string) []string {
	parts := strings.Split(cols, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}
