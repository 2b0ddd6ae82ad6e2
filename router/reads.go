package router

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// getTransfer serves GET /transfers/{id}: the debit as its shard holds it, for the client that
// made it only, and where its credit stands. The debit's shard knows a credit it still owes; one
// it no longer lists (settled and cleared, or written with the debit) is read on dst's shard.
// What it reports is on the shards' synchronous standbys first (confirmed): a row whose commit
// stopped waiting for them is visible on the primary and may be gone after a failover, and a
// client that was told its transfer exists would not retry it.
func (s *Server) getTransfer(w http.ResponseWriter, r *http.Request) {
	client, err := s.authenticate(r)
	if err != nil {
		challenge(w, clientRealm)
		writeProblem(w, probUnauthorized, err.Error(), 0)
		return
	}
	id := r.PathValue("id")
	ksid, ok := parseTransferID(id)
	if !ok {
		writeProblem(w, probInvalidID, "a transfer id is 48 lower-case hex digits, as returned in Location", 0)
		return
	}
	topo := s.HoldTopology()
	defer topo.Release()
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ShardPool.RequestTimeout)
	defer cancel()
	var t idem.LedgerTransfer
	get := func(sh *topology.Shard) (err error) {
		if t, err = idem.GetTransfer(ctx, sh.Pool, id, client); err != nil {
			return err
		}
		return sh.ConfirmReplicated(ctx)
	}
	shard, err := onShard(topo, ksid, get)
	if errors.Is(err, idem.ErrNotFound) {
		if prev, ok, perr := s.onPreviousOwner(topo, ksid, shard, get); ok && !errors.Is(perr, idem.ErrNotFound) {
			shard, err = prev, perr
		}
	}
	if err == nil && t.Credit == idem.CreditUnknown {
		var settled bool
		shard, err = onShard(topo, shardmap.KeyspaceID(t.Dst), func(sh *topology.Shard) (err error) {
			if t.SettledAt, settled, err = idem.CreditSettledAt(ctx, sh.Pool, id); err != nil || !settled {
				return err
			}
			return sh.ConfirmReplicated(ctx)
		})
		t.Credit = idem.CreditPending
		if settled {
			t.Credit = idem.CreditSettled
		}
	}
	switch {
	case errors.Is(err, idem.ErrNotFound):
		writeProblem(w, probNotFound, "", 0)
	case err != nil:
		s.shardFailure(w, shard, err, retryLater)
	default:
		credit := &creditView{State: string(t.Credit)}
		if t.Credit == idem.CreditSettled {
			credit.SettledAt = t.SettledAt.UTC().Format(time.RFC3339Nano)
		}
		writeJSON(w, http.StatusOK, transferView{ID: t.TransferID, Src: t.Src, Dst: t.Dst, Amount: t.Amount,
			Currency: t.Currency, Reference: t.Reference, CreatedAt: t.CreatedAt.UTC().Format(time.RFC3339Nano), Credit: credit})
	}
}

// onShard runs fn on the shard of topo that owns keyspace id ksid, counted against its
// connection limit, and returns that shard's name.
func onShard(topo *topology.Topology, ksid uint64, fn func(*topology.Shard) error) (string, error) {
	shard, _ := topo.Map.ShardFor(ksid)
	conn := topo.Shard(shard.Name)
	if err := conn.Enter(); err != nil {
		return shard.Name, err
	}
	defer conn.Leave()
	return shard.Name, fn(conn)
}

// balanceView is the body of GET /accounts/{id}/balance.
type balanceView struct {
	Account  int64             `json:"account"`
	Balances []currencyBalance `json:"balances"`
}

// currencyBalance is an account's position in one currency: balance = credits - debits, and
// pending_out the part of debits whose credit has not reached its destination yet.
type currencyBalance struct {
	Currency   string `json:"currency"`
	Balance    int64  `json:"balance"`
	Credits    int64  `json:"credits"`
	Debits     int64  `json:"debits"`
	PendingOut int64  `json:"pending_out"`
}

// getBalance serves GET /accounts/{id}/balance from the account's own shard, where both legs of
// every transfer touching it live, once what it read is on the shard's synchronous standbys (as
// getTransfer). Any authenticated client may read any account: shardgate has no notion of who
// owns an account, so per-user rules belong to the service in front.
func (s *Server) getBalance(w http.ResponseWriter, r *http.Request) {
	if _, err := s.authenticate(r); err != nil {
		challenge(w, clientRealm)
		writeProblem(w, probUnauthorized, err.Error(), 0)
		return
	}
	acct, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		writeProblem(w, probInvalidAccount, "an account is a 64-bit signed decimal integer", 0)
		return
	}
	ksid := shardmap.KeyspaceID(acct)
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ShardPool.RequestTimeout)
	defer cancel()
	var (
		balances []idem.CurrencyBalance
		version  int64
	)
	read := func() (string, error) {
		topo := s.HoldTopology()
		defer topo.Release()
		get := func(sh *topology.Shard) (err error) {
			if balances, version, err = idem.Balance(ctx, sh.Pool, acct, ksid); err != nil {
				return err
			}
			return sh.ConfirmReplicated(ctx)
		}
		shard, err := onShard(topo, ksid, get)
		if errors.Is(err, idem.ErrNotOwned) && version <= topo.Map.Version {
			if prev, ok, perr := s.onPreviousOwner(topo, ksid, shard, get); ok && !errors.Is(perr, idem.ErrNotOwned) {
				return prev, perr
			}
		}
		return shard, err
	}
	shard, err := read()
	if errors.Is(err, idem.ErrNotOwned) && version > s.Topology().Map.Version && s.ReloadAtLeast(version) {
		shard, err = read()
	}
	switch {
	case errors.Is(err, idem.ErrNotOwned):
		writeProblem(w, probStaleMap, "the account's key range is moving between shards; "+retryLater, s.cfg.ShardPool.RetryAfter)
	case err != nil:
		s.shardFailure(w, shard, err, retryLater)
	default:
		out := balanceView{Account: acct, Balances: make([]currencyBalance, 0, len(balances))}
		for _, b := range balances {
			out.Balances = append(out.Balances, currencyBalance{Currency: b.Currency, Balance: b.Credits - b.Debits,
				Credits: b.Credits, Debits: b.Debits, PendingOut: b.PendingOut})
		}
		writeJSON(w, http.StatusOK, out)
	}
}
