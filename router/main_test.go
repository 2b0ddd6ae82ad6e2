package router

import (
	"os"
	"testing"

	"github.com/shardgate/shardgate/internal/pgtest"
)

// TestMain gives the tests that need shards a local PostgreSQL server (package pgtest); the
// others never touch it.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
