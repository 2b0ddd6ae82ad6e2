// Package testkit holds the small helpers several test suites share: shard maps written from a
// one-line description of who owns what, and a log sink safe for concurrent writers. Only tests
// import it.
package testkit

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/shardgate/shardgate/shardmap"
)

// UnusedDSN is the DSN of every shard of a map no test connects through.
func UnusedDSN(string) string { return "host=unused" }

// ShardMap parses a map of version v. owners is "shard=range,range shard=range ..." in map
// order (an empty range list owns nothing); dsn gives each shard's DSN.
func ShardMap(t testing.TB, v int64, owners string, dsn func(shard string) string) *shardmap.Map {
	t.Helper()
	m, err := shardmap.Parse("shardmap.yaml", shardMapYAML(v, owners, dsn), nil)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// WriteShardMap writes the map ShardMap(t, v, owners, dsn) parses to path, by a rename as an
// operator's tooling does (a router reloading it never reads half a file), and returns it.
func WriteShardMap(t testing.TB, path string, v int64, owners string, dsn func(shard string) string) *shardmap.Map {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, shardMapYAML(v, owners, dsn), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return ShardMap(t, v, owners, dsn)
}

// shardMapYAML is the map file of ShardMap's arguments.
func shardMapYAML(v int64, owners string, dsn func(shard string) string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "version: %d\nshards:\n", v)
	for _, o := range strings.Fields(owners) {
		name, ranges, _ := strings.Cut(o, "=")
		quoted := []string{}
		for _, r := range strings.Split(ranges, ",") {
			if r != "" {
				quoted = append(quoted, strconv.Quote(r))
			}
		}
		fmt.Fprintf(&b, "  - {name: %s, dsn: %s, ranges: [%s]}\n", name, strconv.Quote(dsn(name)), strings.Join(quoted, ", "))
	}
	return []byte(b.String())
}

// SyncBuffer is a bytes.Buffer that goroutines may write while a test reads it.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
