// Package shardtest builds the shards of a test on the server of package pgtest: one database
// per shard, migrated, with today's partitions, and, when asked, owning its ranges of a shard
// map. It lives apart from pgtest because it migrates with package idem, whose own tests use
// pgtest.
package shardtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/pgtest"
	"github.com/shardgate/shardgate/partition"
	"github.com/shardgate/shardgate/shardmap"
)

// Pools are the test's connections to its shards, by shard name.
type Pools map[string]*pgxpool.Pool

// New creates a shard for each name: a new database of the test server, migrated, with daily
// partitions for today and tomorrow, owning nothing yet. The pools close with the test; without
// a server the test is skipped (see pgtest.NewDB).
func New(t testing.TB, names ...string) Pools {
	t.Helper()
	p := Pools{}
	for _, n := range names {
		p[n] = prepare(t, n, pgtest.NewDB(t, n+"_"))
	}
	return p
}

// OnServers creates a shard for each name as New does, but each on a PostgreSQL server of its
// own, started with opts (localpg.Start) and stopped with the test: for benchmarks whose shards
// must not share WAL, buffers and checkpoints, as shards on separate machines do not. Without
// server binaries the test is skipped, unless CI is set, where it fails.
func OnServers(t testing.TB, opts localpg.Options, names ...string) Pools {
	t.Helper()
	p := Pools{}
	for _, n := range names {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		s, err := localpg.Start(ctx, opts)
		cancel()
		switch {
		case err != nil && os.Getenv("CI") != "":
			t.Fatalf("CI is set and PostgreSQL could not start for shard %s: %v", n, err)
		case err != nil:
			t.Skipf("PostgreSQL could not start for shard %s: %v", n, err)
		}
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("stop the server of shard %s: %v", n, err)
			}
		})
		pool, err := pgxpool.New(context.Background(), s.DSN()+"&pool_max_conns=20")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		p[n] = prepare(t, n, pool)
	}
	return p
}

// prepare migrates shard n's database and makes today's and tomorrow's partitions.
func prepare(t testing.TB, n string, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	if _, err := idem.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate shard %s: %v", n, err)
	}
	if _, err := idem.EnsurePartitions(ctx, pool, partition.Daily, time.Now(), 1); err != nil {
		t.Fatalf("partitions of shard %s: %v", n, err)
	}
	return pool
}

// ForMap creates a shard for every shard of m, as New does, and grants each its ranges of m.
func ForMap(t testing.TB, m *shardmap.Map) Pools {
	t.Helper()
	names := make([]string, len(m.Shards))
	for i, s := range m.Shards {
		names[i] = s.Name
	}
	p := New(t, names...)
	p.Grant(t, m)
	return p
}

// Pool is the pool of shard name, nil for a shard the test does not have; it is the pool
// function rangemove.ApplyMap and reconcile.Run take.
func (p Pools) Pool(name string) *pgxpool.Pool { return p[name] }

// Grant makes every shard of m own its ranges of m, directly, without moving rows: a range a
// shard owned before and m does not give it stays, inactive, as moving.
func (p Pools) Grant(t testing.TB, m *shardmap.Map) {
	t.Helper()
	for _, s := range m.Shards {
		o := idem.Ownership{Shard: s.Name, MapVersion: m.Version, Ranges: m.Ownership()[s.Name]}
		if err := idem.ApplyOwnership(context.Background(), p[s.Name], o, idem.Grant); err != nil {
			t.Fatalf("grant shard %s its ranges of map version %d: %v", s.Name, m.Version, err)
		}
	}
}
