package shardtest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/internal/pgtest"
	"github.com/shardgate/shardgate/internal/testkit"
	"github.com/shardgate/shardgate/partition"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// ForMap gives every shard of the map its own database, migrated, with today's and tomorrow's
// partitions, owning exactly its ranges of the map; New's shards own nothing.
func TestForMap(t *testing.T) {
	ctx := context.Background()
	m := testkit.ShardMap(t, 3, "sa=-40,c0- sb=40-c0 sc=", testkit.UnusedDSN)
	p := ForMap(t, m)
	if len(p) != 3 {
		t.Fatalf("%d pools, want one per shard of the map (3)", len(p))
	}
	dbs := map[string]string{}
	for _, s := range m.Shards {
		pool := p.Pool(s.Name)
		if pool == nil {
			t.Fatalf("no pool for shard %s", s.Name)
		}
		var db string
		if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
			t.Fatal(err)
		}
		if other, ok := dbs[db]; ok {
			t.Errorf("shards %s and %s share database %s", other, s.Name, db)
		}
		dbs[db] = s.Name
		o, err := idem.ReadOwnership(ctx, pool)
		if err != nil {
			t.Fatalf("shard %s: %v", s.Name, err)
		}
		if got, want := fmt.Sprint(o.Ranges), fmt.Sprint(m.Ownership()[s.Name]); o.Shard != s.Name || o.MapVersion != 3 || got != want || len(o.Moving) != 0 {
			t.Errorf("shard %s owns %+v, want %s at version 3 owning %s", s.Name, o, s.Name, want)
		}
		for _, day := range []time.Time{time.Now(), time.Now().Add(24 * time.Hour)} {
			name := partition.At(partition.Daily, day).Name
			var exists bool
			if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists); err != nil || !exists {
				t.Errorf("shard %s: partition %s missing (%v)", s.Name, name, err)
			}
		}
	}
	if p.Pool("sd") != nil {
		t.Error("Pool of a shard the test does not have is not nil")
	}

	fresh := New(t, "sx")
	o, err := idem.ReadOwnership(ctx, fresh.Pool("sx"))
	if err != nil || o.Shard != "" || len(o.Ranges) != 0 {
		t.Errorf("a new shard owns %+v (%v), want nothing", o, err)
	}
}

// OnServers gives each shard a server of its own, with the options given, and prepares it as
// New does.
func TestOnServers(t *testing.T) {
	ctx := context.Background()
	p := OnServers(t, localpg.Options{Settings: map[string]string{"work_mem": "7MB"}}, "sa", "sb")
	ports := map[uint16]string{}
	for _, n := range []string{"sa", "sb"} {
		pool := p.Pool(n)
		if other, ok := ports[pool.Config().ConnConfig.Port]; ok {
			t.Errorf("shards %s and %s share the server on port %d", other, n, pool.Config().ConnConfig.Port)
		}
		ports[pool.Config().ConnConfig.Port] = n
		var workMem string
		var partitioned bool
		if err := pool.QueryRow(ctx, "SELECT current_setting('work_mem'), to_regclass($1) IS NOT NULL",
			partition.At(partition.Daily, time.Now()).Name).Scan(&workMem, &partitioned); err != nil {
			t.Fatalf("shard %s: %v", n, err)
		}
		if workMem != "7MB" || !partitioned {
			t.Errorf("shard %s: work_mem %s, today's partition there: %v; want the settings given and a migrated shard", n, workMem, partitioned)
		}
	}
}
