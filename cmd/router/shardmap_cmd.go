package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/shardmap"
)

// Exit statuses of runShardmap. A problem found (1) is kept apart from a
// usage error (2) so scripts can tell "the map is bad" from "I called it
// wrong".
const (
	exitOK      = 0
	exitProblem = 1
	exitUsage   = 2
)

const shardmapUsage = `usage:
  router shardmap check FILE          validate a shard map and report every problem
  router shardmap route FILE ACCOUNT  show the keyspace id, range and shard of ACCOUNT
  router shardmap diff OLD NEW        show what replacing map OLD by NEW changes
  router shardmap apply --config router.yaml [--dry-run] [--map FILE] [--pace R]
                                      make the shards own the ranges of the map router.yaml names
                                      (or of FILE, put in its place at the fence), moving rows;
                                      --dry-run prints the plan and changes nothing; --pace pauses
                                      R times each copy or purge batch's time after it
                                      (range_moves.pace, 1 unless set; 0 does not pause)
  router shardmap status --config router.yaml
                                      show what each shard owns and where range moves stand`

// runShardmap implements `router shardmap check FILE`, `route FILE ACCOUNT`,
// `diff OLD NEW`, `apply --config FILE [--dry-run]` and `status --config FILE`; args are the
// arguments after "shardmap". It returns the process exit status: 0 on
// success, 1 for a problem found (an invalid or unreadable map, or a diff
// whose new version does not increase) and 2 for a usage error. Results go
// to stdout, errors to stderr.
func runShardmap(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return usageError(stderr, "missing subcommand")
	}
	sub, rest := args[0], args[1:]
	if sub == "apply" {
		return exitStatus(shardmapApply(ctx, rest, stdout), stderr)
	}
	if sub == "status" {
		return exitStatus(shardmapStatus(ctx, rest, stdout), stderr)
	}
	want := map[string]int{"check": 1, "route": 2, "diff": 2}
	switch n, known := want[sub]; {
	case sub == "help" || sub == "-h" || sub == "--help":
		fmt.Fprintln(stdout, shardmapUsage)
		return exitOK
	case !known:
		return usageError(stderr, fmt.Sprintf("unknown subcommand %q", sub))
	case len(rest) != n:
		return usageError(stderr, fmt.Sprintf("%s takes %d arguments, got %d", sub, n, len(rest)))
	}
	switch sub {
	case "check":
		return shardmapCheck(rest[0], stdout, stderr)
	case "route":
		return shardmapRoute(rest[0], rest[1], stdout, stderr)
	default:
		return shardmapDiff(rest[0], rest[1], stdout, stderr)
	}
}

func usageError(stderr io.Writer, reason string) int {
	fmt.Fprintf(stderr, "router shardmap: %s\n%s\n", reason, shardmapUsage)
	return exitUsage
}

func shardmapCheck(path string, stdout, stderr io.Writer) int {
	m, ok := loadShardmap("check", path, stderr)
	if !ok {
		return exitProblem
	}
	shards := "shards"
	if len(m.Shards) == 1 {
		shards = "shard"
	}
	fmt.Fprintf(stdout, "ok: version %d, %d %s, keyspace fully covered\n", m.Version, len(m.Shards), shards)
	return exitOK
}

func shardmapRoute(path, account string, stdout, stderr io.Writer) int {
	// The account is checked before the map is read: calling it wrong is a
	// usage error whatever the state of the map.
	acct, err := strconv.ParseInt(account, 10, 64)
	if err != nil {
		return usageError(stderr, fmt.Sprintf("ACCOUNT must be a decimal 64-bit integer, got %q", account))
	}
	m, ok := loadShardmap("route", path, stderr)
	if !ok {
		return exitProblem
	}
	fmt.Fprintln(stdout, m.Route(acct))
	return exitOK
}

func shardmapDiff(oldPath, newPath string, stdout, stderr io.Writer) int {
	// Both maps are loaded before giving up so that one run shows the
	// problems of both files.
	prev, okOld := loadShardmap("diff", oldPath, stderr)
	next, okNew := loadShardmap("diff", newPath, stderr)
	if !okOld || !okNew {
		return exitProblem
	}
	d := shardmap.Compare(prev, next)
	fmt.Fprintln(stdout, d)
	if !d.VersionIncreases() {
		fmt.Fprintf(stderr, "router shardmap diff: version of %s (%d) does not increase over %s (%d)\n", newPath, d.NewVersion, oldPath, d.OldVersion)
		return exitProblem
	}
	return exitOK
}

// loadShardmap loads path, printing every validation problem, or the read
// error, to stderr followed by a one-line summary.
func loadShardmap(sub, path string, stderr io.Writer) (*shardmap.Map, bool) {
	m, err := shardmap.Load(path)
	if err == nil {
		return m, true
	}
	var verr *shardmap.ValidationError
	if errors.As(err, &verr) {
		fmt.Fprintln(stderr, verr)
		fmt.Fprintf(stderr, "router shardmap %s: %s is invalid: %d problem(s)\n", sub, path, len(verr.Problems))
	} else {
		fmt.Fprintf(stderr, "router shardmap %s: %v\n", sub, err)
	}
	return nil, false
}

// shardmapApply makes the shards own the ranges of the map router.yaml names; with --dry-run
// it prints what that would move, and changes nothing.
func shardmapApply(ctx context.Context, args []string, stdout io.Writer) error {
	var dryRun bool
	var mapFile string
	var pace *float64
	return withConfig("shardmap apply", args, stdout, func(cfg *config.Config, m *shardmap.Map) error {
		if pace != nil {
			cfg.RangeMoves.Pace = *pace
		}
		if mapFile != "" {
			next, err := shardmap.Load(mapFile)
			if err != nil {
				return err
			}
			m = next
		}
		if err := reachShards(ctx, cfg, m); err != nil {
			return err
		}
		switch {
		case dryRun:
			return service.PlanMap(ctx, cfg, m, stdout)
		case mapFile != "":
			return service.ApplyMapFile(ctx, cfg, m, mapFile, stdout)
		}
		return service.ApplyMap(ctx, cfg, m, stdout)
	}, func(fs *flag.FlagSet) {
		fs.BoolVar(&dryRun, "dry-run", false, "print the plan (ranges, shards, rows to move) and change nothing")
		fs.StringVar(&mapFile, "map", "", "apply this map file instead of the one router.yaml names, and put it in its place once the moving ranges are fenced")
		fs.Func("pace", "after each copy, catch-up or purge batch that took d, pause `R`×d, leaving the shards' CPU to transfers (0 to 10; router.yaml's range_moves.pace unless given)", func(v string) error {
			r, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("%q is not a number", v)
			}
			if err := config.CheckPace(r); err != nil {
				return err
			}
			pace = &r
			return nil
		})
	})
}
