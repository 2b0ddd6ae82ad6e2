package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// buildOnline builds ix on conn, which holds no transaction, without blocking writes to its
// table, and returns once the index is valid. It may be run again at any point: what an earlier
// run left (an index already built, an invalid one from a build that was interrupted, partitions
// already done) is kept or finished.
func buildOnline(ctx context.Context, conn *pgx.Conn, ix OnlineIndex) error {
	var kind string
	err := conn.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", ix.Table).Scan(&kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("table %s does not exist before the migration; an index on a table the migration creates belongs among its statements", ix.Table)
	}
	if err != nil {
		return err
	}
	switch kind {
	case "r":
		return buildConcurrently(ctx, conn, ix.Table, ix.Name, ix.definition())
	case "p":
		return buildPartitioned(ctx, conn, ix)
	default:
		return fmt.Errorf("%s is not a table (relkind %s)", ix.Table, kind)
	}
}

// buildConcurrently makes sure the plain table has a valid index name of definition def
// (OnlineIndex.definition), built with CREATE INDEX CONCURRENTLY: an invalid index of that name,
// left by an interrupted build, is dropped concurrently first.
func buildConcurrently(ctx context.Context, conn *pgx.Conn, table, name, def string) error {
	valid, onTable, exists, err := indexState(ctx, conn, name)
	if err != nil {
		return err
	}
	if exists && onTable != table {
		return fmt.Errorf("an index named %s already exists on %s", name, onTable)
	}
	if exists && valid {
		return nil
	}
	id, tbl := pgx.Identifier{name}.Sanitize(), pgx.Identifier{table}.Sanitize()
	if exists {
		if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+id); err != nil {
			return fmt.Errorf("drop the invalid index %s left by an interrupted build: %w", name, err)
		}
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE INDEX CONCURRENTLY %s ON %s %s", id, tbl, def)); err != nil {
		return fmt.Errorf("build %s on %s: %w", name, table, err)
	}
	return nil
}

// buildPartitioned builds ix on a partitioned table: the parent's index is created ON ONLY the
// parent (at once, and invalid while a partition lacks it), then each partition's is built
// concurrently and attached to it; with the last, the parent's index becomes valid. A partition
// attached later gets its index from the parent's.
func buildPartitioned(ctx context.Context, conn *pgx.Conn, ix OnlineIndex) error {
	_, onTable, exists, err := indexState(ctx, conn, ix.Name)
	if err != nil {
		return err
	}
	if exists && onTable != ix.Table {
		return fmt.Errorf("an index named %s already exists on %s", ix.Name, onTable)
	}
	id := pgx.Identifier{ix.Name}.Sanitize()
	if !exists {
		if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE INDEX %s ON ONLY %s %s", id, pgx.Identifier{ix.Table}.Sanitize(), ix.definition())); err != nil {
			return fmt.Errorf("create %s on only %s: %w", ix.Name, ix.Table, err)
		}
	}
	// Partitions without an index attached to the parent's.
	rows, err := conn.Query(ctx, `SELECT c.relname, c.relkind::text FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
		WHERE h.inhparent = to_regclass($1)
		  AND NOT EXISTS (SELECT FROM pg_inherits ih JOIN pg_index i ON i.indexrelid = ih.inhrelid
		                   WHERE ih.inhparent = to_regclass($2) AND i.indrelid = c.oid)
		ORDER BY c.relname`, ix.Table, ix.Name)
	if err != nil {
		return err
	}
	type part struct{ name, kind string }
	parts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (part, error) {
		var p part
		return p, r.Scan(&p.name, &p.kind)
	})
	if err != nil {
		return err
	}
	for _, p := range parts {
		if p.kind != "r" {
			return fmt.Errorf("partition %s of %s is not a plain table (relkind %s)", p.name, ix.Table, p.kind)
		}
		child := partitionIndexName(p.name, ix)
		if err := buildConcurrently(ctx, conn, p.name, child, ix.definition()); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("ALTER INDEX %s ATTACH PARTITION %s", id, pgx.Identifier{child}.Sanitize())); err != nil {
			return fmt.Errorf("attach %s to %s: %w", child, ix.Name, err)
		}
	}
	valid, _, _, err := indexState(ctx, conn, ix.Name)
	if err != nil {
		return err
	}
	if !valid {
		return fmt.Errorf("%s is still invalid after every partition of %s has its index", ix.Name, ix.Table)
	}
	return nil
}

// partitionIndexName names a partition's part of ix as PostgreSQL names the index it creates on
// a partition attached later (partition, columns and "idx" joined by "_", the longer of the first
// two shortened to fit 63 bytes), so that a shard's partitions are named alike whichever way
// they got theirs.
func partitionIndexName(partition string, ix OnlineIndex) string {
	var cols []string
	for _, c := range strings.Split(ix.Columns, ",") {
		cols = append(cols, strings.TrimSpace(c))
	}
	name1, name2, label := partition, strings.Join(cols, "_"), "idx"
	avail := 63 - (1 + len(name2) + 1 + len(label)) + len(name2)
	n1, n2 := len(name1), len(name2)
	for n1+n2 > avail {
		if n1 > n2 {
			n1--
		} else {
			n2--
		}
	}
	return name1[:n1] + "_" + name2[:n2] + "_" + label
}

// indexState reports whether the index name exists, on which table, and whether it is valid.
func indexState(ctx context.Context, conn *pgx.Conn, name string) (valid bool, table string, exists bool, err error) {
	err = conn.QueryRow(ctx, `SELECT i.indisvalid, t.relname FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid
		WHERE i.indexrelid = to_regclass($1)`, name).Scan(&valid, &table)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, "", false, nil
	}
	return valid, table, err == nil, err
}
