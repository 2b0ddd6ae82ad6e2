package router

import (
	"strings"
	"testing"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/shardmap"
)

// TestOpenTopologyErrorHidesPassword covers DSNs that pass shardmap's
// syntax check but that pgx rejects: pgx quotes the DSN in its error and
// its redaction misses libpq spellings such as blanks around '='.
func TestOpenTopologyErrorHidesPassword(t *testing.T) {
	for _, dsn := range []string{
		`host=h password = s3cr3t port=notaport`,
		`host=h password='s3 cr3t' port=notaport`,
		`host=h password = 's3\'cr3t' sslmode=sometimes`,
		`postgres://u:s3cr3t@h:5432/db?sslmode=sometimes`,
	} {
		src := "version: 1\nshards:\n  - name: a\n    dsn: \"" + strings.ReplaceAll(dsn, `\`, `\\`) + "\"\n    ranges: [-]\n"
		m, err := shardmap.Parse("shardmap.yaml", []byte(src), nil)
		if err != nil {
			t.Fatalf("Parse(%q): %v", dsn, err)
		}
		topo, err := OpenTopology(m, nil, config.ShardPool{MaxConns: 1})
		if err == nil {
			topo.Close()
			t.Fatalf("OpenTopology accepted dsn %q", dsn)
		}
		if msg := err.Error(); strings.Contains(msg, "s3") || strings.Contains(msg, "cr3t") || !strings.Contains(msg, "shard a") {
			t.Errorf("dsn %q: error %q leaks the password or does not name the shard", dsn, msg)
		}
	}
}
