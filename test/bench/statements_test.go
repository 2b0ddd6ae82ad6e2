package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// With -bench.statements N, both PostgreSQL servers load pg_stat_statements (tracking the
// statements inside functions too), and each phase of the same-shard, cross-shard and peer rows
// prints the N statements that took the longest, per transfer: where PostgreSQL's time went.

// statementSettings are the server settings -bench.statements needs.
var statementSettings = map[string]string{
	"shared_preload_libraries":         "pg_stat_statements",
	"pg_stat_statements.track":         "all",
	"pg_stat_statements.max":           "1000",
	"pg_stat_statements.save":          "off",
	"pg_stat_statements.track_utility": "off",
}

// statementRows are the rows whose phases -bench.statements reports.
func statementRow(r row) bool { return r == routerNewRow || r == crossNewRow || r == peerRow }

// createStatementViews makes pg_stat_statements readable on each admin pool.
func createStatementViews(ctx context.Context, admins ...*pgxpool.Pool) error {
	for _, a := range admins {
		if _, err := a.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return fmt.Errorf("-bench.statements: %w", err)
		}
	}
	return nil
}

// resetStatements forgets what both servers counted so far.
func (f *fixture) resetStatements(ctx context.Context) error {
	for _, a := range []*pgxpool.Pool{f.admin, f.admin2} {
		if _, err := a.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
			return err
		}
	}
	return nil
}

// statement is one line of pg_stat_statements, on one server.
type statement struct {
	db, query           string
	nested              bool
	calls, rows, blocks int64
	ms, walBytes        float64
}

// reportStatements writes the f.statements statements of both servers that took the longest
// since the last reset, each per transfer of the phase (transfers of them): calls, µs of
// execution (a statement inside a function counts in the function's time as well, and is
// marked "in"), rows, shared blocks touched and WAL bytes.
func (f *fixture) reportStatements(ctx context.Context, w io.Writer, name string, transfers int64) error {
	var all []statement
	for _, a := range []*pgxpool.Pool{f.admin, f.admin2} {
		rows, err := a.Query(ctx, `SELECT d.datname, NOT s.toplevel, s.calls, s.rows, s.shared_blks_hit + s.shared_blks_read,
			s.total_exec_time, s.wal_bytes::float8, regexp_replace(s.query, '\s+', ' ', 'g')
			  FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
			 WHERE s.query NOT LIKE '%pg_stat_statements%'
			 ORDER BY s.total_exec_time DESC LIMIT $1`, f.statements)
		if err != nil {
			return err
		}
		got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (statement, error) {
			var s statement
			err := r.Scan(&s.db, &s.nested, &s.calls, &s.rows, &s.blocks, &s.ms, &s.walBytes, &s.query)
			return s, err
		})
		if err != nil {
			return err
		}
		all = append(all, got...)
	}
	slices.SortFunc(all, func(a, b statement) int { return cmp.Compare(b.ms, a.ms) })
	if len(all) > f.statements {
		all = all[:f.statements]
	}
	t := float64(max(transfers, 1))
	fmt.Fprintf(w, "statements, %s, per transfer (%d transfers):\n", name, transfers)
	fmt.Fprintf(w, "  %-9s %-3s %6s %8s %6s %7s %8s  %s\n", "database", "", "calls", "µs", "rows", "blocks", "WAL B", "statement")
	for _, s := range all {
		in := ""
		if s.nested {
			in = "in"
		}
		q := s.query
		if len(q) > 110 {
			q = q[:110] + "…"
		}
		fmt.Fprintf(w, "  %-9s %-3s %6.2f %8.1f %6.2f %7.1f %8.0f  %s\n", s.db, in, float64(s.calls)/t, s.ms*1000/t,
			float64(s.rows)/t, float64(s.blocks)/t, s.walBytes/t, strings.TrimSpace(q))
	}
	return nil
}
