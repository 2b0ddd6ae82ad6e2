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
	"runtime"
	"syscall"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/buildinfo"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/shardmap"
)

const usage = `usage: router <command> [flags]

commands:
  serve --config router.yaml             serve the API; SIGHUP or a change of the map file reloads the shard map
  migrate --config router.yaml           apply migrations, partitions and key-range ownership on every shard
  maintain --config router.yaml --once   one pass of partition upkeep on every shard
  shardmap check FILE                    validate a shard map
  shardmap route FILE ACCOUNT            show which shard owns an account
  shardmap diff OLD NEW                  show what changes between two maps
  shardmap apply --config router.yaml [--dry-run] [--map FILE] [--pace R]
                                         make the shards own the map's ranges (copy while serving, fence, grant)
  shardmap status --config router.yaml   show what each shard owns and where range moves stand
  reconcile --config router.yaml [--since 1h] [--repair]
                                         check that the shards' ledgers add up (exit status 1 if not); --repair
                                         makes missing credits owed again
  dev [--shards N] [--listen ADDR] [--dir DIR]
                                         local sandbox: PostgreSQL shards as local processes, migrated, served;
                                         with --dir the sandbox (data and edited shard map) is kept across runs
  token new --name NAME                  a new client token, and the router.yaml lines with its hash
  version                                print the build's version

Run 'router <command> --help' for a command's flags.
`

// version is the release, set with -ldflags "-X main.version=v1.2.3" (make build and
// scripts/release.sh take it from the git tag). Empty, the module version of `go install
// …@v1.2.3` stands in (internal/buildinfo).
var version = ""

func init() { buildinfo.Release = version }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage marks errors in how the command was called (exit status 2); errHelp a --help that
// was answered (exit status 0).
var (
	errUsage = errors.New("usage")
	errHelp  = errors.New("help shown")
)

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
		return runShardmap(ctx, rest, stdout, stderr)
	case "serve":
		err = withConfig(cmd, rest, stdout, func(cfg *config.Config, m *shardmap.Map) error {
			return serve(ctx, cfg, m, log)
		})
	case "migrate":
		err = withConfig(cmd, rest, stdout, func(cfg *config.Config, m *shardmap.Map) error {
			if err := reachShards(ctx, cfg, m); err != nil {
				return err
			}
			return service.Migrate(ctx, cfg, m, stdout)
		})
	case "maintain":
		var once bool
		err = withConfig(cmd, rest, stdout, func(cfg *config.Config, m *shardmap.Map) error {
			if !once {
				return fmt.Errorf("%w: maintain needs --once (serve runs upkeep on a schedule)", errUsage)
			}
			return service.Maintain(ctx, cfg, m, stdout)
		}, func(fs *flag.FlagSet) { fs.BoolVar(&once, "once", false, "run one pass and exit") })
	case "reconcile":
		err = reconcileCommand(ctx, rest, stdout)
	case "dev":
		err = dev(ctx, rest, stdout, log)
	case "token":
		err = tokenCommand(rest, stdout)
	case "version", "--version":
		fmt.Fprintf(stdout, "router %s (%s %s/%s)\n", buildinfo.Version(), buildinfo.GoVersion(), runtime.GOOS, runtime.GOARCH)
		return 0
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		err = fmt.Errorf("%w: unknown command %q", errUsage, cmd)
	}
	return exitStatus(err, stderr)
}

// exitStatus prints err as one line and returns the process's exit status.
func exitStatus(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "router: %v (run `router help` for usage)\n", err)
		return 2
	}
	fmt.Fprintf(stderr, "router: %v\n", err)
	return 1
}

// parseFlags parses a command's flags. --help prints them to stdout and returns errHelp; any
// other mistake, or a stray argument, is a usage error.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stdout, "usage: router %s [flags]\n\nflags:\n", fs.Name())
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return errHelp
	}
	if err != nil {
		return fmt.Errorf("%w: %s: %v", errUsage, fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: %s: unexpected argument %q", errUsage, fs.Name(), fs.Arg(0))
	}
	return nil
}

// withConfig parses `--config FILE` (plus any extra flags), loads router.yaml and the shard map
// it names, and calls fn.
func withConfig(cmd string, args []string, stdout io.Writer, fn func(*config.Config, *shardmap.Map) error, extra ...func(*flag.FlagSet)) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	path := fs.String("config", "router.yaml", "router.yaml to use")
	for _, e := range extra {
		e(fs)
	}
	if err := parseFlags(fs, args, stdout); err != nil {
		return err
	}
	cfg, m, err := service.Load(*path)
	if err != nil {
		return missingConfig(*path, err)
	}
	return fn(cfg, m)
}
