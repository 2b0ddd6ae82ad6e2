// Command router is shardgate: an HTTP router that makes money transfers over sharded
// PostgreSQL safe to retry. See README.md for the commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

const usage = `usage: router <command> [flags]

commands:
  serve --config router.yaml             serve the API; SIGHUP or a change of the map file reloads the shard map
  migrate --config router.yaml           apply migrations, partitions and key-range ownership on every shard
  maintain --config router.yaml --once   one pass of partition upkeep on every shard
  shardmap check FILE                    validate a shard map
  shardmap route FILE ACCOUNT            show which shard owns an account
  shardmap diff OLD NEW                  show what changes between two maps
  shardmap apply --config router.yaml    make the shards own the map's ranges (revoke, move rows, grant)
  dev [--shards N] [--listen ADDR]       local sandbox: PostgreSQL shards as local processes, migrated, served
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks errors in how the command was called (exit status 2).
var errUsage = errors.New("usage")

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(stderr, nil))

	var err error
	switch cmd, rest := args[0], args[1:]; cmd {
	case "shardmap":
		if len(rest) > 0 && rest[0] == "apply" {
			err = withConfig("shardmap apply", rest[1:], func(cfg *config.Config, m *shardmap.Map, _ *flag.FlagSet) error {
				topo, err := topology.OpenForCommand(m, cfg.ShardPool)
				if err != nil {
					return err
				}
				defer topo.Close()
				return applyMap(ctx, cfg, m, topo.Pool, stdout)
			})
			break
		}
		return runShardmap(rest, stdout, stderr)
	case "serve":
		err = withConfig(cmd, rest, func(cfg *config.Config, m *shardmap.Map, _ *flag.FlagSet) error {
			return serve(ctx, cfg, m, log)
		})
	case "migrate":
		err = withConfig(cmd, rest, func(cfg *config.Config, m *shardmap.Map, _ *flag.FlagSet) error {
			return migrate(ctx, cfg, m, stdout)
		})
	case "maintain":
		var once bool
		err = withConfig(cmd, rest, func(cfg *config.Config, m *shardmap.Map, fs *flag.FlagSet) error {
			if !once {
				return fmt.Errorf("%w: maintain needs --once (serve runs upkeep on a schedule)", errUsage)
			}
			return maintainOnce(ctx, cfg, m, stdout)
		}, func(fs *flag.FlagSet) { fs.BoolVar(&once, "once", false, "run one pass and exit") })
	case "dev":
		err = dev(ctx, rest, stdout, log)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = fmt.Errorf("%w: unknown command %q", errUsage, cmd)
	}
	if err == nil {
		return 0
	}
	if errors.Is(err, errUsage) {
		fmt.Fprintf(stderr, "router: %v (run `router help` for usage)\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "router: %v\n", err)
	return 1
}

// withConfig parses `--config FILE` (plus any extra flags), loads router.yaml and the shard map
// it names, and calls fn.
func withConfig(cmd string, args []string, fn func(*config.Config, *shardmap.Map, *flag.FlagSet) error, extra ...func(*flag.FlagSet)) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", "router.yaml", "router.yaml to use")
	for _, e := range extra {
		e(fs)
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %s: %v", errUsage, cmd, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: %s: unexpected argument %q", errUsage, cmd, fs.Arg(0))
	}
	cfg, m, err := loadConfig(*path)
	if err != nil {
		return err
	}
	return fn(cfg, m, fs)
}

func loadConfig(path string) (*config.Config, *shardmap.Map, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, nil, err
	}
	m, err := shardmap.Load(cfg.ShardmapPath)
	if err != nil {
		return nil, nil, err
	}
	return cfg, m, nil
}
