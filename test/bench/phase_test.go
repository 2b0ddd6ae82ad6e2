package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"
)

// runLevel runs one round's phases at concurrency c, adding what they measured to res. It
// serves the level's routers, warmed up at c: one with group commit on, and one with it off at
// the latency concurrencies. Odd rounds run the phases in reverse order, so that no phase
// always meets the machine (and the tables) in the state the same other phase left.
func (f *fixture) runLevel(ctx context.Context, b *testing.B, s settings, round, c int, res *[numRows]measurement) {
	closeRouter := func(rt *routerServer) {
		if err := rt.close(); err != nil {
			b.Error(err)
		}
	}
	on, err := f.startWarmRouter(ctx, c, groupCommitOn)
	if err != nil {
		b.Fatalf("router with group commit on at c=%d: %v", c, err)
	}
	defer closeRouter(on)
	var off *routerServer
	if slices.Contains(s.latency, c) {
		if off, err = f.startWarmRouter(ctx, c, groupCommitOff); err != nil {
			b.Fatalf("router with group commit off at c=%d: %v", c, err)
		}
		defer closeRouter(off)
	}
	if _, err := f.runLoad(ctx, f.floor, c, floorWarmup, nil, false); err != nil {
		b.Fatalf("warming the floor up at c=%d: %v", c, err)
	}
	peer, err := f.startPeer(ctx, c)
	if err != nil {
		b.Fatalf("peer at c=%d: %v", c, err)
	}
	defer func() {
		if err := peer.close(); err != nil {
			b.Error(err)
		}
	}()
	order := phasesAt(c, s)
	if round%2 == 1 {
		slices.Reverse(order)
	}
	for _, r := range order {
		name := fmt.Sprintf("round %d, c=%d, %s", round+1, c, r)
		statements := f.statements > 0 && statementRow(r)
		res[r].add(f.phase(ctx, b, name, r, func() (measurement, error) {
			if statements {
				if err := f.resetStatements(ctx); err != nil {
					return measurement{}, err
				}
			}
			before, err := f.cpuNow()
			if err != nil {
				return measurement{}, err
			}
			m, err := f.measure(ctx, r, c, s.duration, on, off, peer.server)
			after, cpuErr := f.cpuNow()
			m.cpu = after.minus(before)
			if err == nil && statements {
				// A cross-shard phase's statements include its warm-up's and its deliveries.
				err = f.reportStatements(ctx, os.Stdout, name, max(m.txns, m.committed))
			}
			return m, errors.Join(err, cpuErr)
		}))
	}
}

// startWarmRouter serves a router for concurrency c with group commit's max_batch and warms it
// up at c on new keys.
func (f *fixture) startWarmRouter(ctx context.Context, c, maxBatch int) (*routerServer, error) {
	rt, err := f.startRouter(c, maxBatch)
	if err != nil {
		return nil, err
	}
	if _, err := f.runLoad(ctx, rt.server, c, warmup, nil, true); err != nil {
		rt.close() //nolint:errcheck // the warm-up's error is the one to report
		return nil, fmt.Errorf("warming up: %w", err)
	}
	return rt, nil
}

// measure runs row r's phase at concurrency c for d; on and off are the level's routers with
// group commit on and off (off only at the latency concurrencies), peer its peer.
func (f *fixture) measure(ctx context.Context, r row, c int, d time.Duration, on, off *routerServer, peer *server) (measurement, error) {
	switch r {
	case anchorRow:
		return f.runPgbench(ctx, pgbenchRun{script: "anchor.sql", clients: c, duration: d, searchPath: anchorSchema})
	case functionRow:
		vars := maps.Clone(f.vars)
		vars["n"] = strconv.Itoa(f.runs * runStride)
		f.runs++
		return f.runPgbench(ctx, pgbenchRun{script: "transfer_new.sql", clients: c, duration: d, vars: vars})
	case routerNewRow:
		before, err := on.readGroupStats()
		if err != nil {
			return measurement{}, err
		}
		m, err := f.runLoad(ctx, on.server, c, d, nil, true)
		if err != nil {
			return m, err
		}
		after, err := on.readGroupStats()
		if err != nil {
			return m, err
		}
		// Every new transfer of the phase went through group commit, once.
		if m.groups = after.minus(before); int64(m.groups.items) != m.txns {
			return m, fmt.Errorf("the router's groups held %.0f transfers, the load generator had %d created", m.groups.items, m.txns)
		}
		return m, nil
	case routerOffRow:
		return f.runLoad(ctx, off.server, c, d, nil, true)
	case routerReplayRow:
		return f.runLoad(ctx, on.server, c, d, f.created, false)
	case floorRow:
		return f.runLoad(ctx, f.floor, c, d, nil, false)
	case crossNewRow:
		return f.measureCross(ctx, c, d)
	case peerRow:
		return f.runLoad(ctx, peer, c, d, nil, false)
	}
	return measurement{}, fmt.Errorf("no phase measures row %d", r)
}

// runLoad runs srv's load generator at concurrency c for d: new keys with replay nil, else
// replays of replay. With keep, the transfers it created are kept for the routers' replays.
func (f *fixture) runLoad(ctx context.Context, srv *server, c int, d time.Duration, replay []transfer, keep bool) (measurement, error) {
	res := srv.load.run(ctx, c, d, replay)
	if keep {
		f.created = append(f.created, res.created...)
	}
	return measurement{txns: res.ok, elapsed: res.elapsed, latencies: res.latencies}, res.err
}

// runPgbench runs pgbench and converts its report.
func (f *fixture) runPgbench(ctx context.Context, r pgbenchRun) (measurement, error) {
	var rep pgbenchReport
	for attempt := 1; ; attempt++ {
		r.connecting = f.connecting[r.clients]
		var err error
		if rep, err = f.pgbench.run(ctx, r); err != nil {
			return measurement{}, err
		}
		// Later runs at this concurrency allow half as long again as the slowest so far.
		f.connecting[r.clients] = max(f.connecting[r.clients], rep.connect*3/2)
		if rep.processed > 0 {
			break
		}
		// Its clients connected too late to run anything, so it wrote nothing: once more, with
		// time for connecting.
		if attempt == 2 || f.connecting[r.clients] == r.connecting {
			return measurement{}, fmt.Errorf("pgbench completed no transaction in %d s: its %d clients took %v to connect (%v allowed)",
				int(r.duration/time.Second)+r.extraSeconds(), r.clients, rep.connect, r.connecting)
		}
	}
	if rep.tps <= 0 {
		return measurement{}, fmt.Errorf("pgbench reports %g tps", rep.tps)
	}
	elapsed := time.Duration(float64(rep.processed) / rep.tps * float64(time.Second))
	return measurement{txns: rep.processed, elapsed: elapsed}, nil
}

// tableCounts are the rows of the tables the phases write in the bench shard's database: the
// shard's ledger and idempotency records, the anchor's ledger and key table, and the peer's.
// (The cross-shard phases write on shards of their own and check them themselves.)
type tableCounts struct {
	ledger, records, anchorLedger, anchorKeys, peerLedger, peerKeys int64
}

// wants is what a phase of row r that counted txns transactions must add to the tables: a
// new-key transfer two ledger rows (its debit, and its credit, written in the same transaction
// because the one bench shard owns dst too) and one record, an anchor transaction one row in each
// of its tables, a peer transfer two rows in its ledger and one key, a replay, the floor or a
// cross-shard transfer nothing here.
func (r row) wants(txns int64) tableCounts {
	switch r {
	case anchorRow:
		return tableCounts{anchorLedger: txns, anchorKeys: txns}
	case functionRow, routerNewRow, routerOffRow:
		return tableCounts{ledger: 2 * txns, records: txns}
	case peerRow:
		return tableCounts{peerLedger: 2 * txns, peerKeys: txns}
	}
	return tableCounts{}
}

func (f *fixture) counts(ctx context.Context) (tableCounts, error) {
	var n tableCounts
	err := f.admin.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger_entries), (SELECT count(*) FROM idempotency_record),
		(SELECT count(*) FROM `+anchorSchema+`.ledger), (SELECT count(*) FROM `+anchorSchema+`.idem),
		(SELECT count(*) FROM peer.ledger), (SELECT count(*) FROM peer.idem)`).
		Scan(&n.ledger, &n.records, &n.anchorLedger, &n.anchorKeys, &n.peerLedger, &n.peerKeys)
	if err != nil {
		return n, fmt.Errorf("counting rows: %w", err)
	}
	return n, nil
}

// check compares what the tables gained since before with what row r's txns transactions must
// have added.
func (f *fixture) check(ctx context.Context, r row, txns int64, before tableCounts) error {
	if txns == 0 {
		return fmt.Errorf("no transfer completed")
	}
	after, err := f.counts(ctx)
	if err != nil {
		return err
	}
	got := tableCounts{after.ledger - before.ledger, after.records - before.records,
		after.anchorLedger - before.anchorLedger, after.anchorKeys - before.anchorKeys,
		after.peerLedger - before.peerLedger, after.peerKeys - before.peerKeys}
	if want := r.wants(txns); got != want {
		return fmt.Errorf("%d transactions added %+v rows; want %+v", txns, got, want)
	}
	return nil
}

// phase runs one measured phase of row r and checks the rows it wrote (see row.wants).
func (f *fixture) phase(ctx context.Context, b *testing.B, name string, r row, run func() (measurement, error)) measurement {
	before, err := f.counts(ctx)
	if err != nil {
		b.Fatal(err)
	}
	m, err := run()
	if err == nil {
		err = f.check(ctx, r, m.txns, before)
	}
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return m
}
