package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// dev runs a local sandbox: PostgreSQL shards as local processes (no Docker), a generated
// router.yaml and shardmap.yaml, migrations, and the router serving until Ctrl-C.
func dev(ctx context.Context, args []string, out io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	n := fs.Int("shards", 2, "number of local PostgreSQL shards (1-16)")
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve on")
	dir := fs.String("dir", "", "directory for shard data and generated config (default: a temporary directory, removed on exit)")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: dev: %v", errUsage, err)
	}
	if *n < 1 || *n > 16 {
		return fmt.Errorf("%w: dev: --shards must be between 1 and 16", errUsage)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("dev: %w (choose another with --listen)", err)
	}
	base := *dir
	if base == "" {
		if base, err = os.MkdirTemp("", "shardgate-dev-"); err != nil {
			ln.Close()
			return err
		}
		defer os.RemoveAll(base)
	}

	fmt.Fprintf(out, "starting %d PostgreSQL shards under %s ...\n", *n, base)
	dsns, stopShards, err := startDevShards(ctx, *n, filepath.Join(base, "shards"))
	if err != nil {
		ln.Close()
		return err
	}
	defer stopShards()

	cfgPath := filepath.Join(base, "router.yaml")
	if err := os.WriteFile(filepath.Join(base, "shardmap.yaml"), []byte(devShardmap(dsns)), 0o600); err != nil {
		ln.Close()
		return err
	}
	if err := os.WriteFile(cfgPath, []byte(devRouterYAML(*listen)), 0o600); err != nil {
		ln.Close()
		return err
	}
	cfg, m, err := loadConfig(cfgPath)
	if err != nil {
		ln.Close()
		return err
	}
	if err := migrate(ctx, cfg, m, out); err != nil {
		ln.Close()
		return err
	}
	return serveOn(ctx, ln, cfg, m, log, func(addr string) {
		fmt.Fprintf(out, devBanner, cfgPath, addr, addr, addr)
	})
}

const devBanner = `
shardgate dev sandbox is up (config: %s). Try:

  curl -si -X POST http://%s/transfers \
    -H 'Idempotency-Key: 9f1c2d64-0a1e-4f7c-9d2b-3d8e5c1a77f0' \
    -H 'Content-Type: application/json' \
    -d '{"src": 8842, "dst": 1190, "amount": 2500}'

Run it twice: the second answer is the first replayed (Idempotent-Replayed: true).
Route of an account: curl -s 'http://%s/admin/route?account=8842'   Metrics: http://%s/metrics
Ctrl-C stops the router and the shards.

`

// devShardmap splits the keyspace evenly over the shards, on one-byte boundaries.
func devShardmap(dsns []string) string {
	var b strings.Builder
	b.WriteString("version: 1\nshards:\n")
	n := len(dsns)
	for i, dsn := range dsns {
		lo, hi := "", ""
		if i > 0 {
			lo = fmt.Sprintf("%02x", i*256/n)
		}
		if i < n-1 {
			hi = fmt.Sprintf("%02x", (i+1)*256/n)
		}
		fmt.Fprintf(&b, "  - name: shard-%d\n    dsn: %s\n    ranges: [\"%s-%s\"]\n", i, dsn, lo, hi)
	}
	return b.String()
}

func devRouterYAML(listen string) string {
	return fmt.Sprintf(`listen: %s
shardmap: shardmap.yaml
idempotency:
  retention: 720h
  partition_interval: 24h
  replay_window: 168h
  in_progress_retry_after: 1s
auth:
  mode: none
`, listen)
}
