package topology

import (
	"testing"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/shardmap"
)

func openOne(t *testing.T, dsn string, sp config.ShardPool) *Topology {
	t.Helper()
	src := "version: 1\nshards:\n  - name: a\n    dsn: \"" + dsn + "\"\n    ranges: [-]\n"
	m, err := shardmap.Parse("shardmap.yaml", []byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := Open(m, nil, sp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Close)
	return topo
}

// TestOpenPoolSettings: router.yaml's pool settings are the defaults, a setting written in the
// DSN wins (it was once silently overwritten), and every session runs READ COMMITTED, which
// the transfer functions need, whichever command opened the pool.
func TestOpenPoolSettings(t *testing.T) {
	sp := config.ShardPool{MaxConns: 16, MaxWaiting: 64, ConnectTimeout: 2 * time.Second}
	tests := []struct {
		dsn      string
		maxConns int32
		timeout  time.Duration
		slots    int
	}{
		{"postgres://u@h/db", 16, 2 * time.Second, 16 + 64},
		{"postgres://u@h/db?pool_max_conns=3&connect_timeout=7", 3, 7 * time.Second, 3 + 64},
		{"host=h pool_max_conns=5", 5, 2 * time.Second, 5 + 64},
	}
	for _, tt := range tests {
		c := openOne(t, tt.dsn, sp).Shard("a")
		cfg := c.Pool.Config()
		if cfg.MaxConns != tt.maxConns || cfg.ConnConfig.ConnectTimeout != tt.timeout || cap(c.slots) != tt.slots {
			t.Errorf("%s: max_conns %d, connect_timeout %s, slots %d; want %d, %s, %d", tt.dsn,
				cfg.MaxConns, cfg.ConnConfig.ConnectTimeout, cap(c.slots), tt.maxConns, tt.timeout, tt.slots)
		}
		if iso := cfg.ConnConfig.RuntimeParams["default_transaction_isolation"]; iso != "read committed" {
			t.Errorf("%s: default_transaction_isolation %q, want read committed", tt.dsn, iso)
		}
	}
}

func TestOpenForCommandHasRoomForApplyLocks(t *testing.T) {
	src := "version: 1\nshards:\n  - name: a\n    dsn: postgres://u@h/db\n    ranges: [-]\n"
	m, err := shardmap.Parse("shardmap.yaml", []byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	topo, err := OpenForCommand(m, config.ShardPool{MaxConns: 1, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer topo.Close()
	if n := topo.Pool("a").Config().MaxConns; n != 4 {
		t.Errorf("max_conns %d, want 4", n)
	}
}

// TestReloadReusesUnchangedPools: a shard that keeps its name and DSN keeps its pool (and its
// in-flight connections); retiring the old topology closes only the pools it does not share.
func TestReloadReusesUnchangedPools(t *testing.T) {
	parse := func(v int, dsnB string) *shardmap.Map {
		src := "version: " + string(rune('0'+v)) + "\nshards:\n  - name: a\n    dsn: postgres://u@a/db\n    ranges: [-80]\n  - name: b\n    dsn: " + dsnB + "\n    ranges: [80-]\n"
		m, err := shardmap.Parse("shardmap.yaml", []byte(src), nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	sp := config.ShardPool{MaxConns: 2, ConnectTimeout: time.Second}
	old, err := Open(parse(1, "postgres://u@b/db"), nil, sp)
	if err != nil {
		t.Fatal(err)
	}
	next, err := Open(parse(2, "postgres://u@b2/db"), old, sp)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if next.Shard("a") != old.Shard("a") || next.Shard("b") == old.Shard("b") {
		t.Fatal("want shard a's pool reused and shard b's reopened")
	}
	if !old.Hold() {
		t.Fatal("a live topology refused Hold")
	}
	retired := make(chan struct{})
	go func() { old.Retire(next); close(retired) }()
	// Wait until Retire has marked the topology retired (however slow the machine), then check
	// that it is still waiting for its user.
	isRetired := func() bool { old.mu.Lock(); defer old.mu.Unlock(); return old.retired }
	for deadline := time.Now().Add(5 * time.Second); !isRetired(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("Retire did not mark the topology retired within 5s")
		}
	}
	select {
	case <-retired:
		t.Fatal("Retire returned while a user held the topology")
	case <-time.After(50 * time.Millisecond):
	}
	if old.Hold() {
		t.Fatal("a retiring topology accepted a new user")
	}
	old.Release()
	<-retired
}
