package idem

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/internal/pgtest"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/shardmap"
)

// The statements a router of the previous release (migrations 0001-0007) sends to a shard's
// functions, verbatim: its group functions (idem.TransferBatch, idem.Transfer and the relay's
// credits) and its range move (rangemove). Its arguments are what batchArgs builds, unchanged
// since. A rolling upgrade must keep every one of them working while and after this release
// migrates.
const (
	prevRowsSQL = `SELECT idx, outcome, stored_response, shard_map_version, credit_settled
FROM shardgate_apply_rows($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`
	prevBatchSQL = `SELECT idx, outcome, stored_response, shard_map_version, credit_settled
FROM shardgate_apply_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`
	prevFloorSQL = "SELECT min(created_at), max(greatest(created_at, shardgate_key_floor(key))) FROM idempotency_record WHERE keyspace_id >= $1 AND ($2::bigint IS NULL OR keyspace_id < $2)"
)

// prevGroup sends reqs through q, one of the previous release's group statements, and returns
// the outcome of each item.
func prevGroup(ctx context.Context, pool *pgxpool.Pool, q string, reqs ...TransferRequest) ([]string, error) {
	args, err := batchArgs(reqs)
	if err != nil {
		return nil, err
	}
	rows, err := pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	outcomes := make([]string, len(reqs))
	var (
		idx     int
		outcome string
		stored  []byte
		version *int64
		settled *bool
	)
	_, err = pgx.ForEachRow(rows, []any{&idx, &outcome, &stored, &version, &settled}, func() error {
		outcomes[idx-1] = outcome
		return nil
	})
	return outcomes, err
}

// releaseShard is a shard as the release with migrations 0001-n left it, owning "-80" (so
// keyspace id here is its own and there is not), with partitions from today on.
func releaseShard(t *testing.T, n int) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.NewDB(t, "")
	restoreRelease(t, pool, n)
	low, _ := shardmap.ParseKeyRange("-80")
	if err := ApplyOwnership(context.Background(), pool, Ownership{Shard: "old", MapVersion: 3, Ranges: []shardmap.KeyRange{low}}, Grant); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsurePartitions(context.Background(), pool, partition.Daily, time.Now(), 1); err != nil {
		t.Fatal(err)
	}
	return pool
}

// contents is every row of the shard's tables (the migrations' bookkeeping up to 0007 included),
// as text, in a stable order.
func contents(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		"idempotency_record", "ledger_entries", "shardgate_credit_outbox", "shardgate_credit_sweep",
		"shardgate_record_floor", "shardgate_shard", "shardgate_owned_range",
		"(SELECT * FROM shardgate_schema_migrations WHERE version <= 7)",
	} {
		var rows string
		if err := pool.QueryRow(context.Background(), fmt.Sprintf("SELECT coalesce(string_agg(x::text, E'\\n' ORDER BY x::text), '') FROM %s x", q)).Scan(&rows); err != nil {
			t.Fatalf("read %s: %v", q, err)
		}
		fmt.Fprintf(&b, "%s:\n%s\n", q, rows)
	}
	return b.String()
}

// A shard of the previous release, with records in every state, ledger rows of both legs and
// owed credits written by that release's own calls, upgrades with nothing lost: every row is
// still there, unchanged; replays, refusals and new transfers go through the new functions; the
// owed credits are delivered by this release's relay calls; and a second Migrate changes nothing.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	ctx := context.Background()
	pool := releaseShard(t, 7)

	// What the previous release wrote.
	local, owed1, owed2 := debitTo("up-local", 10, here), debitTo("up-owed-1", 11, there), debitTo("up-owed-2", 12, there)
	reused := debitTo("up-owed-1", 99, there) // the same key for another request, in the same group
	remote := CreditRequest(OwedCredit{TransferID: "t-remote", Src: 7, Dst: 2, Amount: 5, Currency: "EUR", Client: "client-a"}, here, 720*time.Hour)
	if got, err := prevGroup(ctx, pool, prevRowsSQL, local); err != nil || !slices.Equal(got, []string{"applied"}) {
		t.Fatalf("previous release, one debit: %v %v", got, err)
	}
	if got, err := prevGroup(ctx, pool, prevBatchSQL, owed1, owed2, remote, reused); err != nil ||
		!slices.Equal(got, []string{"applied", "applied", "applied", "key_reused"}) {
		t.Fatalf("previous release, a group: %v %v", got, err)
	}
	old := debitTo("up-old", 10, here) // applied long ago, its record gone with retention
	if got, err := prevGroup(ctx, pool, prevRowsSQL, old); err != nil || got[0] != "applied" {
		t.Fatalf("previous release, the old debit: %v %v", got, err)
	}
	mustExec(t, pool, "DELETE FROM idempotency_record WHERE key = 'up-old'")
	mustExec(t, pool, "UPDATE ledger_entries SET created_at = now() - interval '800 hours' WHERE transfer_id = 't-up-old'")
	busy := debitTo("up-busy", 10, here) // a record in progress
	mustExec(t, pool, `INSERT INTO idempotency_record (key, scope, request_hash, keyspace_id, state) VALUES ($1, $2, $3, $4, 'in_progress')`,
		busy.Key, busy.Scope, busy.RequestHash, signedKeyspace(busy.KeyspaceID))
	before := contents(t, pool)
	for _, want := range []string{"up-local", "up-owed-2", "t-remote", "in_progress", "t-up-old"} {
		if !strings.Contains(before, want) {
			t.Fatalf("the previous release's rows lack %q:\n%s", want, before)
		}
	}

	applied, err := Migrate(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	fns, err := Functions()
	if err != nil {
		t.Fatal(err)
	}
	ms, err := Migrations()
	if err != nil {
		t.Fatal(err)
	}
	var want []string // every migration after the previous release's 0007, then the function files
	for _, m := range ms {
		if m.Version > 7 {
			want = append(want, fmt.Sprintf("%04d_%s", m.Version, m.Name))
		}
	}
	for _, f := range fns {
		want = append(want, "sql/"+f.Name)
	}
	if !slices.Equal(applied, want) {
		t.Errorf("upgrade applied %v, want %v", applied, want)
	}
	if after := contents(t, pool); after != before {
		t.Fatalf("the upgrade changed rows:\nbefore\n%s\nafter\n%s", before, after)
	}

	// Through this release's code.
	for _, r := range []TransferRequest{local, remote} {
		if res := transferOutcome(t, pool, r, Replayed); res.Response.Status != r.Response.Status || res.Response.Body != r.Response.Body {
			t.Errorf("replay of %s: %+v, want %+v", r.Key, res.Response, r.Response)
		}
	}
	res, err := TransferBatch(ctx, pool, []TransferRequest{owed1, owed2, debitTo("up-new-1", 10, there), debitTo("up-new-2", 10, here), reused})
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []Outcome
	for _, r := range res {
		outcomes = append(outcomes, r.Outcome)
	}
	if wantOut := []Outcome{Replayed, Replayed, Applied, Applied, KeyReused}; !slices.Equal(outcomes, wantOut) {
		t.Errorf("a group after the upgrade: %v, want %v", outcomes, wantOut)
	}
	if res[0].Response.Body != owed1.Response.Body {
		t.Errorf("replayed response %+v, want %+v", res[0].Response, owed1.Response)
	}
	transferOutcome(t, pool, busy, InProgress)
	transferOutcome(t, pool, old, Expired)
	transferOutcome(t, pool, debitTo("up-local", 77, here), KeyReused)

	// The owed credits, the previous release's and the new one, delivered and settled.
	dst := halfShard(t) // of this release, owning here
	credits := claim(t, pool, "relay", time.Minute)
	var ids []string
	settled := map[string]time.Time{}
	for _, c := range credits {
		ids = append(ids, c.TransferID)
		cr := CreditRequest(c, here, 720*time.Hour)
		transferOutcome(t, dst, cr, Applied)
		transferOutcome(t, dst, cr, Replayed)
		at, ok, err := CreditSettledAt(ctx, dst, c.TransferID)
		if err != nil || !ok {
			t.Fatalf("credit %s on its shard: %v %v", c.TransferID, ok, err)
		}
		settled[c.TransferID] = at
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"t-up-new-1", "t-up-owed-1", "t-up-owed-2"}) {
		t.Fatalf("owed credits claimed after the upgrade: %v", ids)
	}
	if err := SettleCredits(ctx, pool, settled); err != nil {
		t.Fatal(err)
	}
	if n, _, err := OwedStats(ctx, pool); err != nil || n != 0 {
		t.Errorf("after delivery, %d credits still owed (%v)", n, err)
	}

	// Again: nothing to do, nothing re-applied.
	var recorded string
	q := "SELECT string_agg(name || ' ' || checksum || ' ' || applied_at, E'\\n' ORDER BY name) FROM shardgate_schema_functions"
	if err := pool.QueryRow(ctx, q).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if again, err := Migrate(ctx, pool); err != nil || len(again) != 0 {
		t.Fatalf("a second Migrate: %v %v, want nothing applied", again, err)
	}
	var recordedAgain string
	if err := pool.QueryRow(ctx, q).Scan(&recordedAgain); err != nil || recordedAgain != recorded {
		t.Errorf("a second Migrate changed the recorded functions: %v\n%s\nwas\n%s", err, recordedAgain, recorded)
	}
}

// schemaOf describes the shard's schema: every function's definition, every column, constraint
// and index.
func schemaOf(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for what, q := range map[string]string{
		"functions": `SELECT p.oid::regprocedure::text || E'\n' || pg_get_functiondef(p.oid) FROM pg_proc p
		               WHERE p.pronamespace = 'public'::regnamespace ORDER BY 1`,
		"columns": `SELECT format('%s.%s %s %s %s', table_name, column_name, data_type, is_nullable, column_default)
		              FROM information_schema.columns WHERE table_schema = 'public' ORDER BY table_name, ordinal_position`,
		"constraints": `SELECT format('%s %s %s', conrelid::regclass, conname, pg_get_constraintdef(oid)) FROM pg_constraint
		                 WHERE connamespace = 'public'::regnamespace ORDER BY 1`,
		"indexes": `SELECT indexdef FROM pg_indexes WHERE schemaname = 'public' ORDER BY 1`,
	} {
		rows, err := pool.Query(context.Background(), q)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		out[what] = strings.Join(lines, "\n")
	}
	return out
}

// functionDefs returns each function's definition with its comments and blank space taken out:
// what it does, not how it is explained.
func functionDefs(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid) FROM pg_proc p
		WHERE p.pronamespace = 'public'::regnamespace`)
	if err != nil {
		t.Fatal(err)
	}
	defs := map[string]string{}
	comment, space := regexp.MustCompile(`--[^\n]*`), regexp.MustCompile(`\s+`)
	var sig, def string
	if _, err := pgx.ForEachRow(rows, []any{&sig, &def}, func() error {
		defs[sig] = strings.TrimSpace(space.ReplaceAllString(comment.ReplaceAllString(def, ""), " "))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return defs
}

// changedSincePreviousRelease names the functions whose files were changed on purpose since the
// release of testdata/release_0007.sql; TestFreshAndUpgradedShardsAgree holds every other to the
// previous release's definition. Empty again once the fixture of the next release is written.
var changedSincePreviousRelease = map[string]bool{"shardgate_copy_records": true,
	"shardgate_apply_batch": true, "shardgate_apply_rows": true} // owed credits leased to their router

// addedSincePreviousRelease names the functions this release added (a file of sql/ the previous
// release did not have). Empty again once the fixture of the next release is written.
var addedSincePreviousRelease = map[string]bool{"shardgate_capture_change": true, "shardgate_capture_start": true, "shardgate_credit_lease": true}

// A fresh shard and one upgraded from the previous release end with the same schema, and the
// functions in sql/ do what the previous release's did: the same definitions but for comments
// (shardgate_prior_outcome, which nothing called, is gone).
func TestFreshAndUpgradedShardsAgree(t *testing.T) {
	fresh := migratedDB(t, "fresh")
	upgraded := pgtest.NewDB(t, "upgraded")
	restoreRelease(t, upgraded, 7)
	previous := functionDefs(t, upgraded)
	if _, err := Migrate(context.Background(), upgraded); err != nil {
		t.Fatal(err)
	}
	a, b := schemaOf(t, fresh), schemaOf(t, upgraded)
	for _, what := range []string{"functions", "columns", "constraints", "indexes"} {
		if a[what] != b[what] {
			t.Errorf("%s differ:\nfresh\n%s\nupgraded\n%s", what, a[what], b[what])
		}
	}
	now := functionDefs(t, upgraded)
	for sig, def := range previous {
		if strings.HasPrefix(sig, "shardgate_prior_outcome(") {
			if _, ok := now[sig]; ok {
				t.Errorf("%s is still defined", sig)
			}
			continue
		}
		if now[sig] != def && !changedSincePreviousRelease[strings.Split(sig, "(")[0]] {
			t.Errorf("%s differs from the previous release's:\nnow\n%s\nbefore\n%s", sig, now[sig], def)
		}
	}
	added := 0
	for sig := range now {
		if _, ok := previous[sig]; !ok && addedSincePreviousRelease[strings.Split(sig, "(")[0]] {
			added++
		}
	}
	if len(now) != len(previous)-1+added {
		t.Errorf("%d functions now, %d before; want the previous release's less shardgate_prior_outcome, and %d added", len(now), len(previous), added)
	}
}

// withFiles is the embedded schema files with the given files replaced or added.
func withFiles(t *testing.T, replace map[string]string) fstest.MapFS {
	t.Helper()
	m := fstest.MapFS{}
	err := fs.WalkDir(schemaFiles, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(schemaFiles, path)
		m[path] = &fstest.MapFile{Data: body}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for path, body := range replace {
		if body == "" {
			delete(m, path)
			continue
		}
		m[path] = &fstest.MapFile{Data: []byte(body)}
	}
	return m
}

// embedded returns the text of an embedded schema file.
func embedded(t *testing.T, path string) string {
	t.Helper()
	b, err := fs.ReadFile(schemaFiles, path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// While this release migrates a shard of the previous one (versioned migration, every function
// file re-applied) and afterwards, and while a later change re-applies every file again, routers
// of the previous release keep sending their statements: every one succeeds and applies.
func TestPreviousReleaseCallsSucceedWhileMigrating(t *testing.T) {
	ctx := context.Background()
	pool := releaseShard(t, 7)

	// Every file changed (a comment more): all replaced again, under load.
	changed := map[string]string{}
	fns, err := Functions()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fns {
		changed["sql/"+f.Name] = f.SQL + "-- changed\n"
	}
	later := withFiles(t, changed)

	var calls atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("roll-%d-%d", w, i)
				var got []string
				var err error
				if i%2 == 0 {
					got, err = prevGroup(ctx, pool, prevRowsSQL, debitTo(key, 1, here))
				} else {
					got, err = prevGroup(ctx, pool, prevBatchSQL, debitTo(key+"a", 1, here), debitTo(key+"b", 1, there),
						debitTo(key+"c", 1, here), debitTo(key+"d", 1, there))
				}
				if err == nil {
					var oldest, newest *time.Time
					err = pool.QueryRow(ctx, prevFloorSQL, signedKeyspace(0), nil).Scan(&oldest, &newest)
				}
				for _, o := range got {
					if err == nil && o != "applied" {
						err = fmt.Errorf("outcome %s", o)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("%s: %w", key, err)
					return
				}
				calls.Add(1)
			}
		}()
	}
	waitCalls := func(n int64) {
		deadline := time.Now().Add(30 * time.Second)
		for calls.Load() < n && time.Now().Before(deadline) && len(errs) == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitCalls(20)
	if _, err := Migrate(ctx, pool); err != nil {
		t.Error(err)
	}
	during := calls.Load()
	waitCalls(during + 20)
	if applied, err := migrate(ctx, pool, later); err != nil || len(applied) != len(fns) {
		t.Errorf("re-applying every file: %v %v", applied, err)
	}
	waitCalls(calls.Load() + 20)
	stop.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a previous release's call failed: %v", err)
	}
	if calls.Load() < during+40 {
		t.Errorf("%d calls in all, %d before the upgrade ended: too few after it to tell", calls.Load(), during)
	}
}

// A function file that does not apply fails Migrate with an error naming it, and rolls back the
// other files of the same run: the shard keeps the functions and checksums it had, and the next
// run with the file fixed applies both.
func TestBrokenFunctionFileChangesNothing(t *testing.T) {
	ctx := context.Background()
	pool := migratedDB(t, "")
	recorded := func() string {
		var s string
		if err := pool.QueryRow(ctx, "SELECT string_agg(name || ' ' || checksum || ' ' || applied_at, E'\\n' ORDER BY name) FROM shardgate_schema_functions").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	body := func(name string) string {
		var s string
		if err := pool.QueryRow(ctx, "SELECT string_agg(prosrc, E'\\n') FROM pg_proc WHERE proname = $1", name).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before, argsBefore, transferBefore := recorded(), body("shardgate_group_args_invalid"), body("shardgate_transfer")

	args := strings.Replace(embedded(t, "sql/shardgate_group_args_invalid.sql"), "SELECT coalesce(", "SELECT /* changed */ coalesce(", 1)
	transfer := embedded(t, "sql/shardgate_transfer.sql")
	broken := strings.Replace(transfer, "SELECT b.idx", "SELEC b.idx", 1)
	if args == embedded(t, "sql/shardgate_group_args_invalid.sql") || broken == transfer {
		t.Fatal("the test's edits no longer apply to the files")
	}
	applied, err := migrate(ctx, pool, withFiles(t, map[string]string{
		"sql/shardgate_group_args_invalid.sql": args, "sql/shardgate_transfer.sql": broken}))
	if err == nil || !strings.Contains(err.Error(), "sql/shardgate_transfer.sql") {
		t.Fatalf("a broken file: %v %v, want an error naming sql/shardgate_transfer.sql", applied, err)
	}
	if len(applied) != 0 {
		t.Errorf("a failed run reports %v applied", applied)
	}
	if recorded() != before || body("shardgate_group_args_invalid") != argsBefore || body("shardgate_transfer") != transferBefore {
		t.Fatal("a failed run changed functions or their checksums")
	}
	if got, err := prevGroup(ctx, pool, prevRowsSQL, testTransfer("after-failure", 1)); err != nil || got[0] != "not_owner" {
		t.Errorf("the shard's functions after the failed run: %v %v", got, err) // it owns no range
	}

	applied, err = migrate(ctx, pool, withFiles(t, map[string]string{"sql/shardgate_group_args_invalid.sql": args}))
	if err != nil || !slices.Equal(applied, []string{"sql/shardgate_group_args_invalid.sql"}) {
		t.Fatalf("with the file fixed: %v %v, want the changed file alone", applied, err)
	}
	if !strings.Contains(body("shardgate_group_args_invalid"), "changed") {
		t.Error("the changed function was not replaced")
	}
}

// Function files are applied each after the files it requires, otherwise by name; a requirement
// that names no file, or a cycle, is refused before anything runs.
func TestFunctionFileOrder(t *testing.T) {
	files := func(m map[string]string) fstest.MapFS {
		fsys := fstest.MapFS{}
		for name, body := range m {
			fsys["sql/"+name] = &fstest.MapFile{Data: []byte(body)}
		}
		return fsys
	}
	got, err := functionsIn(files(map[string]string{
		"a.sql": "-- requires: c d\n--\n-- a\nSELECT 1;\n-- requires: b\n",
		"b.sql": "SELECT 1;\n",
		"c.sql": "-- requires: d.sql\nSELECT 1;\n",
		"d.sql": "SELECT 1;\n",
	}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range got {
		names = append(names, f.Name)
	}
	if want := []string{"b.sql", "d.sql", "c.sql", "a.sql"}; !slices.Equal(names, want) {
		t.Errorf("order %v, want %v", names, want)
	}
	if !slices.Equal(got[3].Requires, []string{"c.sql", "d.sql"}) {
		t.Errorf("a.sql requires %v; want c.sql and d.sql (a requires line after the header does not count)", got[3].Requires)
	}
	for what, m := range map[string]map[string]string{
		"requires x.sql": {"a.sql": "-- requires: x\nSELECT 1;\n"},
		"cycle":          {"a.sql": "-- requires: b\n", "b.sql": "-- requires: a\n", "c.sql": "SELECT 1;\n"},
	} {
		if _, err := functionsIn(files(m)); err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("%v: %v, want an error saying %q", m, err, what)
		}
	}

	embeddedFns, err := Functions()
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, f := range embeddedFns {
		pos[f.Name] = i
	}
	for _, f := range embeddedFns {
		for _, r := range f.Requires {
			if pos[r] >= pos[f.Name] {
				t.Errorf("%s is applied before %s, which it requires", f.Name, r)
			}
		}
	}
}

// Each function file applies on a shard that has the tables and only the files it says it
// requires: its requires line is complete.
func TestFunctionFilesDeclareWhatTheyNeed(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.NewDB(t, "")
	noFunctions := withFiles(t, nil)
	for path := range noFunctions {
		if strings.HasPrefix(path, "sql/") {
			delete(noFunctions, path)
		}
	}
	if _, err := migrate(ctx, pool, noFunctions); err != nil {
		t.Fatal(err)
	}
	fns, err := Functions()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]FunctionFile{}
	for _, f := range fns {
		byName[f.Name] = f
	}
	for _, f := range fns {
		// f and what it requires, transitively, in apply order.
		need := map[string]bool{f.Name: true}
		for changed := true; changed; {
			changed = false
			for n := range need {
				for _, r := range byName[n].Requires {
					if !need[r] {
						need[r], changed = true, true
					}
				}
			}
		}
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, g := range fns {
				if need[g.Name] {
					if _, err := tx.Exec(ctx, g.SQL); err != nil {
						return fmt.Errorf("%s: %w", g.Name, err)
					}
				}
			}
			return errRollback
		})
		if !errors.Is(err, errRollback) {
			t.Errorf("%s with what it requires: %v", f.Name, err)
		}
	}
}

var errRollback = errors.New("rolled back on purpose")

// A function file that is removed drops nothing (that is a versioned migration's job), and its
// checksum is forgotten: if the file comes back, it is applied again.
func TestRemovedFunctionFileIsForgotten(t *testing.T) {
	ctx := context.Background()
	pool := migratedDB(t, "")
	applied, err := migrate(ctx, pool, withFiles(t, map[string]string{"sql/shardgate_transfer.sql": ""}))
	if err != nil || len(applied) != 0 {
		t.Fatalf("without a file: %v %v, want nothing applied", applied, err)
	}
	var recorded, defined bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM shardgate_schema_functions WHERE name = 'shardgate_transfer.sql'),
		EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'shardgate_transfer')`).Scan(&recorded, &defined); err != nil {
		t.Fatal(err)
	}
	if recorded || !defined {
		t.Fatalf("after its file was removed: recorded %v, defined %v; want forgotten and still defined", recorded, defined)
	}
	if applied, err := Migrate(ctx, pool); err != nil || !slices.Equal(applied, []string{"sql/shardgate_transfer.sql"}) {
		t.Fatalf("the file back: %v %v, want it applied", applied, err)
	}
}
