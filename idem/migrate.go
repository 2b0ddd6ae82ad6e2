package idem

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// schemaFiles holds the versioned migrations (migrations/) and the function files (sql/).
//
//go:embed migrations/*.sql sql/*.sql
var schemaFiles embed.FS

// Migration is one versioned schema change, from migrations/NNNN_name.sql: tables, indexes and
// data changes, each applied once and never edited after its release.
type Migration struct {
	Version int
	Name    string
	SQL     string
	// Indexes the migration builds online, from its "-- shardgate: online-index" lines, before
	// its statements run.
	OnlineIndexes []OnlineIndex
	// DropIndexes are the indexes it drops online, from its "-- shardgate: online-drop-index
	// name" lines: with DROP INDEX CONCURRENTLY, once its online indexes are built (so that a
	// replacement is valid before the index it replaces goes) and before its statements run.
	DropIndexes []string
}

// OnlineIndex is an index that a migration builds without holding writes to its table: with
// CREATE INDEX CONCURRENTLY, outside any transaction, and, on a partitioned table, on each
// partition concurrently and then attached to an index created ON ONLY the parent. A migration
// declares one by a line of its file
//
//	-- shardgate: online-index name ON table (column, ...)
//
// Migrate builds a migration's online indexes before its statements, and records the migration
// only once every one of them is valid, so the table must exist before the migration (an index
// on a table the migration creates is built among its statements: the table is empty). A build
// that was interrupted leaves an invalid index, which the next Migrate drops and builds again.
// An index of another kind than btree names its method, and may set storage parameters:
//
//	-- shardgate: online-index name ON table USING brin (column) WITH (pages_per_range = 32)
type OnlineIndex struct {
	Name    string
	Table   string
	Columns string // as written between the parentheses, e.g. "keyspace_id, id"
	Using   string // the index method; empty for btree
	With    string // storage parameters as written between WITH's parentheses, or empty
}

var (
	onlineIndexLine = regexp.MustCompile(`^--\s*shardgate:\s*online-(index|drop-index)\b(.*)$`)
	onlineIndexDecl = regexp.MustCompile(`^\s*([a-z_][a-z0-9_]*)\s+ON\s+([a-z_][a-z0-9_]*)(?:\s+USING\s+([a-z]+))?\s*\(\s*([a-z_][a-z0-9_]*(?:\s*,\s*[a-z_][a-z0-9_]*)*)\s*\)` +
		`(?:\s*WITH\s*\(\s*([a-z_]+\s*=\s*[a-z0-9]+(?:\s*,\s*[a-z_]+\s*=\s*[a-z0-9]+)*)\s*\))?\s*$`)
	onlineDropDecl = regexp.MustCompile(`^\s*([a-z_][a-z0-9_]*)\s*$`)
)

// onlineIndexesOf reads the online-index and online-drop-index lines of a migration file.
func onlineIndexesOf(path, body string) (build []OnlineIndex, drop []string, err error) {
	for i, line := range strings.Split(body, "\n") {
		m := onlineIndexLine.FindStringSubmatch(strings.TrimRight(line, "\r"))
		if m == nil {
			continue
		}
		if m[1] == "drop-index" {
			d := onlineDropDecl.FindStringSubmatch(m[2])
			if d == nil {
				return nil, nil, fmt.Errorf("migration file %s line %d: want \"-- shardgate: online-drop-index name\" with a lower-case name, got %q", path, i+1, line)
			}
			drop = append(drop, d[1])
			continue
		}
		d := onlineIndexDecl.FindStringSubmatch(m[2])
		if d == nil {
			return nil, nil, fmt.Errorf("migration file %s line %d: want \"-- shardgate: online-index name ON table [USING method] (column, ...) [WITH (parameter = value, ...)]\" with lower-case names, got %q", path, i+1, line)
		}
		if len(d[1]) > 63 {
			return nil, nil, fmt.Errorf("migration file %s line %d: index name %s is longer than 63 bytes", path, i+1, d[1])
		}
		build = append(build, OnlineIndex{Name: d[1], Table: d[2], Using: d[3], Columns: d[4], With: d[5]})
	}
	return build, drop, nil
}

// definition is ix's CREATE INDEX after the table's name: method, columns and parameters.
func (ix OnlineIndex) definition() string {
	def := "(" + ix.Columns + ")"
	if ix.Using != "" {
		def = "USING " + ix.Using + " " + def
	}
	if ix.With != "" {
		def += " WITH (" + ix.With + ")"
	}
	return def
}

// FunctionFile is one file of sql/: a SQL function, or a small family of them, defined with
// CREATE OR REPLACE. Migrate applies it whenever its checksum differs from the one the shard
// recorded, so the file is the function's only definition and its history is the file's.
type FunctionFile struct {
	Name     string   // file name, e.g. shardgate_apply_batch.sql
	SQL      string   // its text
	Checksum string   // sha256 of SQL, hex
	Requires []string // files applied before it, from its "-- requires:" header line
}

// Advisory lock ids, in (classid, objid) form so they never meet the single-bigint keys that
// the transfer functions take per idempotency key. LockClass 21319 is "SG". The function files
// name LockClass and LockOwnership too; TestSQLConstantsMatchMigrations holds the two sides
// together.
const (
	LockClass     = 21319
	LockMigrate   = 0
	LockOwnership = 1 // taken shared by every transfer, exclusively by ownership changes
	LockUpkeep    = 2
	LockApply     = 3 // held by a shard map apply on every shard for its whole run
	LockWatch     = 4 // held on the map's first shard by the router that runs the periodic reconcile
)

// Seeds of hashtextextended for the per-key try-locks of the transfer functions (and of the copy of
// moved records): the key lock over scope and key, and the request lock over scope, key and
// request hash. They are SQL's; named here so that a test can check them.
const (
	KeyLockSeed     = 1
	RequestLockSeed = 2
)

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) { return migrationsIn(schemaFiles) }

func migrationsIn(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.Glob(fsys, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, path := range entries {
		base := strings.TrimSuffix(strings.TrimPrefix(path, "migrations/"), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %s: name must be NNNN_name.sql", path)
		}
		body, err := fs.ReadFile(fsys, path)
		if err != nil {
			return nil, err
		}
		online, drop, err := onlineIndexesOf(path, string(body))
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(body), OnlineIndexes: online, DropIndexes: drop})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("two migrations have version %d", ms[i].Version)
		}
	}
	return ms, nil
}

// Functions returns the embedded function files in the order Migrate applies them: each after
// the files it requires, otherwise by name.
func Functions() ([]FunctionFile, error) { return functionsIn(schemaFiles) }

// requiresLine is a function file's header line naming the files (without .sql) it needs first.
var requiresLine = regexp.MustCompile(`^--\s*requires:(.*)$`)

func functionsIn(fsys fs.FS) ([]FunctionFile, error) {
	paths, err := fs.Glob(fsys, "sql/*.sql")
	if err != nil {
		return nil, err
	}
	byName := map[string]*FunctionFile{}
	var names []string
	for _, path := range paths {
		body, err := fs.ReadFile(fsys, path)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(body)
		f := &FunctionFile{Name: strings.TrimPrefix(path, "sql/"), SQL: string(body), Checksum: hex.EncodeToString(sum[:])}
		// Only the leading comment block is header.
		for _, line := range strings.Split(f.SQL, "\n") {
			if !strings.HasPrefix(line, "--") {
				break
			}
			if m := requiresLine.FindStringSubmatch(line); m != nil {
				for _, r := range strings.Fields(m[1]) {
					f.Requires = append(f.Requires, strings.TrimSuffix(r, ".sql")+".sql")
				}
			}
		}
		byName[f.Name] = f
		names = append(names, f.Name)
	}
	sort.Strings(names)
	for _, n := range names {
		for _, r := range byName[n].Requires {
			if byName[r] == nil {
				return nil, fmt.Errorf("function file sql/%s requires %s, which is not in sql/", n, r)
			}
		}
	}
	// Repeatedly take the first file by name whose requirements are all placed.
	placed := map[string]bool{}
	var out []FunctionFile
	for len(out) < len(names) {
		progress := false
		for _, n := range names {
			if placed[n] {
				continue
			}
			ready := true
			for _, r := range byName[n].Requires {
				ready = ready && placed[r]
			}
			if ready {
				placed[n] = true
				out = append(out, *byName[n])
				progress = true
				break
			}
		}
		if !progress {
			var stuck []string
			for _, n := range names {
				if !placed[n] {
					stuck = append(stuck, n)
				}
			}
			return nil, fmt.Errorf("function files require each other in a cycle: %s", strings.Join(stuck, ", "))
		}
	}
	return out, nil
}

// Migrate brings the shard behind pool to this release's schema and returns what it applied:
// first every versioned migration the shard has not applied yet, each in its own transaction
// (named NNNN_name), then, in one transaction, every function file whose checksum differs from
// the one the shard recorded (named sql/file.sql). A function file that fails rolls back all of
// them, and the error names it: the shard keeps the functions it had. Routers migrating the same
// shard at once are serialized by a session advisory lock, so each change runs exactly once, and
// a second Migrate applies nothing.
//
// A migration's online indexes (OnlineIndex) are built first, outside any transaction and
// without holding transfers; the migration is recorded only once they are all valid.
//
// Versioned migrations are recorded by version alone, never by checksum: a shard that applied
// 0001-0007 while they still defined the functions does not run them again, and gets the same
// functions from sql/.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	return migrate(ctx, pool, schemaFiles)
}

func migrate(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS) ([]string, error) {
	ms, err := migrationsIn(fsys)
	if err != nil {
		return nil, err
	}
	fns, err := functionsIn(fsys)
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	if err := waitMigrateLock(ctx, conn.Conn()); err != nil {
		return nil, fmt.Errorf("take migration lock: %w", err)
	}
	// Unlock on a fresh context: the caller's may be what ended us.
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1, $2)", LockClass, LockMigrate) //nolint:errcheck // the session ends with the connection anyway

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS shardgate_schema_migrations (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return nil, fmt.Errorf("create shardgate_schema_migrations: %w", err)
	}
	done := map[int]bool{}
	rows, err := conn.Query(ctx, "SELECT version FROM shardgate_schema_migrations")
	if err != nil {
		return nil, err
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	for _, v := range versions {
		done[int(v)] = true
	}

	var applied []string
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		for _, ix := range m.OnlineIndexes {
			if err := buildOnline(ctx, conn.Conn(), ix); err != nil {
				return applied, fmt.Errorf("migration %04d_%s: index %s on %s: %w", m.Version, m.Name, ix.Name, ix.Table, err)
			}
		}
		for _, name := range m.DropIndexes {
			if _, err := conn.Exec(ctx, "DROP INDEX CONCURRENTLY IF EXISTS "+pgx.Identifier{name}.Sanitize()); err != nil {
				return applied, fmt.Errorf("migration %04d_%s: drop index %s: %w", m.Version, m.Name, name, err)
			}
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			// Exec without arguments uses the simple protocol, which allows many statements.
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO shardgate_schema_migrations (version, name) VALUES ($1, $2)", m.Version, m.Name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migration %04d_%s: %w", m.Version, m.Name, err)
		}
		applied = append(applied, fmt.Sprintf("%04d_%s", m.Version, m.Name))
	}
	fnApplied, err := applyFunctions(ctx, conn.Conn(), fns)
	return append(applied, fnApplied...), err
}

// waitMigrateLock takes the migration lock on conn, trying again until it gets it. It does not
// wait inside pg_advisory_lock: a statement waiting there holds a snapshot, and the
// CREATE INDEX CONCURRENTLY of the migrate holding the lock waits for every older snapshot to
// go, so the two would wait on each other.
func waitMigrateLock(ctx context.Context, conn *pgx.Conn) error {
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", LockClass, LockMigrate).Scan(&got); err != nil {
			return err
		}
		if got {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// applyFunctions applies, in one transaction and in order, the function files whose checksum
// differs from the one recorded in shardgate_schema_functions, and records theirs. It drops no
// function: removing one is a versioned migration's DROP FUNCTION, with its file deleted.
func applyFunctions(ctx context.Context, conn *pgx.Conn, fns []FunctionFile) ([]string, error) {
	var applied []string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "SELECT name, checksum FROM shardgate_schema_functions")
		if err != nil {
			return fmt.Errorf("read shardgate_schema_functions: %w", err)
		}
		recorded := map[string]string{}
		var name, sum string
		if _, err := pgx.ForEachRow(rows, []any{&name, &sum}, func() error { recorded[name] = sum; return nil }); err != nil {
			return fmt.Errorf("read shardgate_schema_functions: %w", err)
		}
		for _, f := range fns {
			if recorded[f.Name] == f.Checksum {
				continue
			}
			// Without arguments Exec uses the simple protocol, which allows many statements.
			if _, err := tx.Exec(ctx, f.SQL); err != nil {
				return fmt.Errorf("function file sql/%s: %w", f.Name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO shardgate_schema_functions (name, checksum) VALUES ($1, $2)
				ON CONFLICT (name) DO UPDATE SET checksum = excluded.checksum, applied_at = now()`, f.Name, f.Checksum); err != nil {
				return fmt.Errorf("record function file sql/%s: %w", f.Name, err)
			}
			applied = append(applied, "sql/"+f.Name)
		}
		// A file that is gone no longer vouches for anything: were it to come back, it applies.
		names := make([]string, len(fns))
		for i, f := range fns {
			names[i] = f.Name
		}
		if _, err := tx.Exec(ctx, "DELETE FROM shardgate_schema_functions WHERE name <> ALL ($1)", names); err != nil {
			return fmt.Errorf("forget removed function files: %w", err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}
