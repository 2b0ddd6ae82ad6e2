package topology

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
)

// ErrNotReplicated means a commit returned while PostgreSQL said it had stopped waiting for the
// synchronous standby: the transaction committed on the primary but may be missing from the
// standby, and a failover now would lose it. The outcome is unknown to the client; a retry with
// the same key is safe.
var ErrNotReplicated = errors.New("the shard committed locally but stopped waiting for its synchronous standby (the wait was cancelled): the outcome is unknown until it replicates; retry with the same key")

// syncRepCancelled is how PostgreSQL begins the WARNING it sends when a commit's wait for a
// synchronous standby ends early (a cancel request, pg_cancel_backend, pg_terminate_backend).
const syncRepCancelled = "canceling the wait for synchronous replication"

// syncRepCancelledOld is the same warning's wording for a query cancel ("canceling wait for
// synchronous replication due to user request").
const syncRepCancelledOld = "canceling wait for synchronous replication"

// commitWatchKey marks a context whose queries report an unreplicated commit.
type commitWatchKey struct{}

// WatchCommits returns a context whose queries on a shard pool are watched for a commit that
// stopped waiting for its synchronous standby, and a check that returns ErrNotReplicated if any
// did. Call the check after the queries end and before acknowledging what they wrote.
func WatchCommits(ctx context.Context) (context.Context, func() error) {
	flag := new(atomic.Bool)
	return context.WithValue(ctx, commitWatchKey{}, flag), func() error {
		if flag.Load() {
			return ErrNotReplicated
		}
		return nil
	}
}

// commitWatcher connects PostgreSQL's notices to the context of the query they arrive during:
// a query's start registers its connection's flag, the connection's notice handler sets it,
// and the query's end (after ReadyForQuery, so after the commit's notices) forgets it.
type commitWatcher struct {
	byConn sync.Map // *pgconn.PgConn → *atomic.Bool
}

func (w *commitWatcher) TraceQueryStart(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	if flag, ok := ctx.Value(commitWatchKey{}).(*atomic.Bool); ok {
		w.byConn.Store(conn.PgConn(), flag)
	}
	return ctx
}

func (w *commitWatcher) TraceQueryEnd(_ context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	w.byConn.Delete(conn.PgConn())
}

// onNotice sets the flag of the query running on c when the notice says its commit stopped
// waiting for the synchronous standby (SQLSTATE 01000, a WARNING).
func (w *commitWatcher) onNotice(c *pgconn.PgConn, n *pgconn.Notice) {
	if n.Code != "01000" || !(strings.HasPrefix(n.Message, syncRepCancelled) || strings.HasPrefix(n.Message, syncRepCancelledOld)) {
		return
	}
	if flag, ok := w.byConn.Load(c); ok {
		flag.(*atomic.Bool).Store(true)
	}
}

// closeOnCancel is the pools' context handler: when a query's context ends, the connection's
// socket is closed and no cancel request is sent. A cancel request ends a commit's wait for its
// synchronous standby with only a WARNING, making rows visible that the standby may lack; a
// closed socket leaves the server waiting, and the rows invisible, until the standby has them.
func closeOnCancel(c *pgconn.PgConn) ctxwatch.Handler {
	return &pgconn.DeadlineContextWatcherHandler{Conn: c.Conn()}
}

// errNoCancelRequest is what a shard connection's dialer answers once the connection is open.
var errNoCancelRequest = errors.New("shard connections send no cancel requests: a cancel would end a commit's wait for the synchronous standby")

// noCancelRequests is the pools' BeforeConnect: once a connection is open, its dialer refuses to
// dial again. The only dial pgconn makes for an open connection is a cancel request, which it
// sends when it closes a connection whose query failed (a timeout included) — and a cancel
// request reaching a backend that waits for its synchronous standby ends the wait.
func noCancelRequests(_ context.Context, cc *pgx.ConnConfig) error {
	dial, after := cc.DialFunc, cc.AfterConnect
	var open atomic.Bool
	cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if open.Load() {
			return nil, errNoCancelRequest
		}
		return dial(ctx, network, addr)
	}
	cc.AfterConnect = func(ctx context.Context, c *pgconn.PgConn) error {
		open.Store(true)
		if after != nil {
			return after(ctx, c)
		}
		return nil
	}
	return nil
}
