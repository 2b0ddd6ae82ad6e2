package topology

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/shardmap"
)

// TestIdentityChangeIsReported: a shard repointed (same name, new DSN, a reload) to another
// database is reported once, with both identities; a connection to the same database is not.
func TestIdentityChangeIsReported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var srvs [2]*localpg.Server
	for i := range srvs {
		srv, err := localpg.Start(ctx, localpg.Options{})
		if err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI is set and PostgreSQL could not start: %v", err)
			}
			t.Skipf("PostgreSQL not available: %v", err)
		}
		t.Cleanup(func() { srv.Close() })
		srvs[i] = srv
	}
	parse := func(v int, dsn string) *shardmap.Map {
		src := "version: " + string(rune('0'+v)) + "\nshards:\n  - name: a\n    dsn: \"" + dsn + "\"\n    ranges: [-]\n"
		m, err := shardmap.Parse("shardmap.yaml", []byte(src), nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	sp := config.ShardPool{MaxConns: 2, ConnectTimeout: 5 * time.Second}
	first, err := Open(parse(1, srvs[0].DSN()), nil, sp)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	var (
		mu      sync.Mutex
		changes []IdentityChange
	)
	first.OnIdentityChange(func(c IdentityChange) { mu.Lock(); changes = append(changes, c); mu.Unlock() })
	if _, err := first.Pool("a").Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	before, ok := first.Identity("a")
	if !ok || before.SystemID == 0 || before.Timeline != 1 {
		t.Fatalf("identity after the first connection: %v (known %t), want a system identifier and timeline 1", before, ok)
	}

	// The same database under a new DSN spelling: no change.
	same, err := Open(parse(2, srvs[0].DSN()+"&application_name=other"), first, sp)
	if err != nil {
		t.Fatal(err)
	}
	defer same.Close()
	if _, err := same.Pool("a").Exec(ctx, "SELECT 1"); err != nil {
		t.Fatal(err)
	}
	// Another database under the same name: one change, old and new.
	moved, err := Open(parse(3, srvs[1].DSN()), same, sp)
	if err != nil {
		t.Fatal(err)
	}
	defer moved.Close()
	for range 2 { // two connections, one report
		c, err := moved.Pool("a").Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release()
	}
	after, _ := moved.Identity("a")
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 1 || changes[0].Shard != "a" || changes[0].Old != before || changes[0].New != after || after == before {
		t.Fatalf("changes %+v (identity before %v, after %v); want exactly one, for shard a, from before to after", changes, before, after)
	}
}
