package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/shardmap"
)

// dev runs a local sandbox: PostgreSQL shards as local processes (no Docker), a generated
// router.yaml and shardmap.yaml, migrations, and the router serving until Ctrl-C. A sandbox kept
// with --dir starts again as it was left: its data, its router.yaml and its shard map, edited
// or not (a moved range, a raised version); only the shards' ports, which are picked anew,
// are written into the map.
func dev(ctx context.Context, args []string, out io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	n := fs.Int("shards", 2, "number of local PostgreSQL shards (1-16); a kept sandbox keeps its own number")
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve on")
	dir := fs.String("dir", "", "directory for shard data, router.yaml and shardmap.yaml, kept across runs (default: a temporary directory, removed on exit)")
	standby := fs.Bool("standby", false, "give each shard a synchronous streaming standby (made afresh at each start), to rehearse a failover")
	if err := parseFlags(fs, args, out); err != nil {
		return err
	}
	if *n < 1 || *n > 16 {
		return fmt.Errorf("%w: dev: --shards must be between 1 and 16", errUsage)
	}
	base := *dir
	if base == "" {
		var err error
		if base, err = os.MkdirTemp("", "shardgate-dev-"); err != nil {
			return err
		}
		defer os.RemoveAll(base)
	}
	unlock, err := lockSandbox(base)
	if err != nil {
		return err
	}
	defer unlock()
	sb, err := openSandbox(base, *n, fs)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("dev: %w (choose another with --listen)", err)
	}
	fmt.Fprintf(out, "starting %d PostgreSQL shards under %s ...\n", sb.n, base)
	dsns, stopShards, err := startDevShards(ctx, sb.n, filepath.Join(base, "shards"), *standby, out)
	if err != nil {
		ln.Close()
		return err
	}
	defer stopShards()
	cfg, m, err := sb.write(dsns, *listen)
	if err == nil {
		err = service.Migrate(ctx, cfg, m, out)
	}
	if err != nil {
		ln.Close()
		return err
	}
	return serveOn(ctx, ln, cfg, m, log, func(addr string) {
		fmt.Fprintf(out, devBanner, sb.path("router.yaml"), sb.path("shardmap.yaml"), addr, addr, addr, addr, addr, sb.path("shardmap.yaml"), sb.path("router.yaml"))
	})
}

// sandbox is the directory of `router dev`: shards/, router.yaml and shardmap.yaml. kept is
// the shard map a kept sandbox has (nil for a new one), and n how many shards it runs.
type sandbox struct {
	dir      string
	kept     *yaml.Node
	keptData []byte // the kept map as the user left it
	n        int
}

func (sb *sandbox) path(name string) string { return filepath.Join(sb.dir, name) }

// openSandbox reads what a kept sandbox in dir has. A kept sandbox runs its own number of
// shards: its map and data are for them, so a --shards that differs is refused.
func openSandbox(dir string, n int, fs *flag.FlagSet) (*sandbox, error) {
	sb := &sandbox{dir: dir, n: n}
	data, err := os.ReadFile(sb.path("shardmap.yaml"))
	if errors.Is(err, iofs.ErrNotExist) {
		return sb, nil
	}
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return nil, fmt.Errorf("dev: %s is not YAML (%v); fix it, or start a new sandbox with another --dir", sb.path("shardmap.yaml"), err)
	}
	sb.kept, sb.keptData, sb.n = &doc, data, len(shardNodes(&doc))
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "shards" })
	if set && n != sb.n {
		return nil, fmt.Errorf("%w: dev: the sandbox in %s has %d shards; run it with --shards %d (or without --shards), or start a new sandbox with another --dir",
			errUsage, dir, sb.n, sb.n)
	}
	return sb, nil
}

// write gives a new sandbox its router.yaml and shard map, or points a kept sandbox's map at
// the shards' new ports, keeping everything else, and loads both.
func (sb *sandbox) write(dsns []string, listen string) (*config.Config, *shardmap.Map, error) {
	mapYAML := []byte(devShardmap(dsns))
	if doc := sb.kept; doc != nil {
		var err error
		var ok bool
		if mapYAML, ok = rewriteDSNs(sb.keptData, doc, dsns); !ok {
			for i, shard := range shardNodes(doc) {
				if dsn := mappingValue(shard, "dsn"); dsn != nil && i < len(dsns) {
					dsn.Value, dsn.Style = dsns[i], 0
				}
			}
			if mapYAML, err = yaml.Marshal(doc); err != nil {
				return nil, nil, err
			}
		}
	}
	if err := writeFileAtomic(sb.path("shardmap.yaml"), mapYAML); err != nil {
		return nil, nil, err
	}
	if _, err := os.Stat(sb.path("router.yaml")); errors.Is(err, iofs.ErrNotExist) {
		if err := writeFileAtomic(sb.path("router.yaml"), []byte(devRouterYAML(listen))); err != nil {
			return nil, nil, err
		}
	}
	return service.Load(sb.path("router.yaml"))
}

// shardNodes returns the entries of the map's shards list.
func shardNodes(doc *yaml.Node) []*yaml.Node {
	if shards := mappingValue(doc.Content[0], "shards"); shards != nil && shards.Kind == yaml.SequenceNode {
		return shards.Content
	}
	return nil
}

// mappingValue returns the value of key in a YAML mapping node, or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// writeFileAtomic replaces path by a rename, so that a router watching it never reads it
// half-written.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

const devBanner = `
shardgate dev sandbox is up (config: %s, shard map: %s). Try:

  curl -si -X POST http://%s/transfers \
    -H 'Idempotency-Key: 9f1c2d64-0a1e-4f7c-9d2b-3d8e5c1a77f0' \
    -H 'Content-Type: application/json' \
    -d '{"src": 8842, "dst": 1190, "amount": 2500}'

Run it twice: the second answer is the first replayed (Idempotent-Replayed: true).
Balances (the credit reaches 1190 once the relay delivers it; GET the Location to see it settle):
  curl -s http://%s/accounts/8842/balance; curl -s http://%s/accounts/1190/balance
Route of an account: curl -s 'http://%s/admin/route?account=8842'   Metrics: http://%s/metrics
To move a range: edit %s (give the range to another shard, raise version; write the
file by rename or save it whole), then run 'router shardmap apply --config %s'. Between
the edit and the apply, transfers in the moving range get 503 shard-map-changing.
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
