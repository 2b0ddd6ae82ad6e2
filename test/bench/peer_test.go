package bench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/router"
	"github.com/shardgate/shardgate/shardmap"
)

// peerHandler serves POST /transfers as the service a team would write without shardgate: plain
// net/http and pgx on one database (the peer schema of testdata/peer_schema.sql), one
// transaction of five statements per new key: claim the key, debit, credit, store the response,
// commit. A key already claimed is answered from its stored response (201 with
// Idempotent-Replayed), 409 while its transaction is in flight, 422 if its body differs. Its 201
// is the router's (Content-Type, Location, body), so the load generator checks it alike.
func peerHandler(pool *pgxpool.Pool, defaultCurrency string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /transfers", func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<16))
		var in floorInput
		if err == nil {
			err = json.Unmarshal(body, &in)
		}
		if err != nil || key == "" || in.Src <= 0 || in.Dst <= 0 || in.Src == in.Dst || in.Amount <= 0 {
			http.Error(w, "a transfer needs an Idempotency-Key and a JSON body with src, dst (another account) and a positive amount", http.StatusBadRequest)
			return
		}
		if in.Currency == "" {
			in.Currency = defaultCurrency
		}
		sum := sha256.Sum256(body)
		hash := hex.EncodeToString(sum[:])
		id := router.TransferID(shardmap.KeyspaceID(in.Src), scope, key)
		view, err := json.Marshal(floorView{ID: id, Src: in.Src, Dst: in.Dst, Amount: in.Amount, Currency: in.Currency, Reference: in.Reference})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		response := string(append(view, '\n'))
		claimed, err := peerTransfer(r.Context(), pool, key, hash, id, in, response)
		switch {
		case err != nil:
			http.Error(w, "storage: "+err.Error(), http.StatusServiceUnavailable)
		case claimed:
			peerAnswer(w, id, response, false)
		default:
			peerReplay(r.Context(), w, pool, key, hash, id)
		}
	})
	return mux
}

// peerTransfer runs the five statements, and reports false (having written nothing) if key was
// claimed before.
func peerTransfer(ctx context.Context, pool *pgxpool.Pool, key, hash, id string, in floorInput, response string) (claimed bool, err error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit it does nothing
	tag, err := tx.Exec(ctx, `INSERT INTO peer.idem (key, request_hash) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`, key, hash)
	if err != nil || tag.RowsAffected() == 0 {
		return false, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO peer.ledger (transfer_id, account_id, amount, kind) VALUES ($1, $2, $3, 'transfer_out')`, id, in.Src, in.Amount); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO peer.ledger (transfer_id, account_id, amount, kind) VALUES ($1, $2, $3, 'transfer_in')`, id, in.Dst, in.Amount); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, `UPDATE peer.idem SET response = $2 WHERE key = $1`, key, response); err != nil {
		return false, err
	}
	return true, tx.Commit(ctx)
}

// peerReplay answers a key claimed before: its stored response, or 409 while its transaction is
// in flight, or 422 if it was claimed with another body.
func peerReplay(ctx context.Context, w http.ResponseWriter, pool *pgxpool.Pool, key, hash, id string) {
	var storedHash string
	var response *string
	err := pool.QueryRow(ctx, `SELECT request_hash, response FROM peer.idem WHERE key = $1`, key).Scan(&storedHash, &response)
	switch {
	case errors.Is(err, pgx.ErrNoRows), err == nil && response == nil:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "a request with this Idempotency-Key is in progress", http.StatusConflict)
	case err != nil:
		http.Error(w, "storage: "+err.Error(), http.StatusServiceUnavailable)
	case storedHash != hash:
		http.Error(w, "this Idempotency-Key was used with another request", http.StatusUnprocessableEntity)
	default:
		peerAnswer(w, id, *response, true)
	}
}

func peerAnswer(w http.ResponseWriter, id, response string, replayed bool) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/transfers/"+id)
	if replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, response) //nolint:errcheck // the load generator reports a short answer
}

// peerServer is the peer served for one concurrency, with its own pool.
type peerServer struct {
	*server
	pool *pgxpool.Pool
}

// startPeer serves the peer for concurrency c, its pool as large as a router's at c, and warms
// it up.
func (f *fixture) startPeer(ctx context.Context, c int) (*peerServer, error) {
	cfg, err := pgxpool.ParseConfig(f.pg.DSN())
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(min(c, routerMaxConns))
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	srv, err := serve(peerHandler(pool, f.base.Transfers.DefaultCurrency), f.base.HTTP, c)
	if err != nil {
		pool.Close()
		return nil, err
	}
	p := &peerServer{server: srv, pool: pool}
	if _, err := f.runLoad(ctx, srv, c, floorWarmup, nil, false); err != nil {
		p.close() //nolint:errcheck // the warm-up's error is the one to report
		return nil, fmt.Errorf("warming up: %w", err)
	}
	return p, nil
}

func (p *peerServer) close() error {
	err := p.server.close()
	p.pool.Close()
	return err
}
