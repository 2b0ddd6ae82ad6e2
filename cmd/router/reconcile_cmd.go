package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/reconcile"
	"github.com/shardgate/shardgate/shardmap"
)

// reconcileCommand is `router reconcile --config router.yaml [--since 1h] [--repair]`: a check
// that the ledgers of the map's shards add up (see package reconcile), read-only unless
// --repair. It prints the report to stdout and returns an error, hence exit status 1, when the
// check found discrepancies (left after the repair, with --repair) or could not be made; 2 is
// for a usage error.
func reconcileCommand(ctx context.Context, args []string, stdout io.Writer) error {
	var (
		since  time.Duration
		repair bool
	)
	return withConfig("reconcile", args, stdout, func(cfg *config.Config, m *shardmap.Map) error {
		if since < 0 {
			return fmt.Errorf("%w: reconcile: --since must be 0 (the whole history) or more, got %s", errUsage, since)
		}
		return service.Reconcile(ctx, cfg, m, reconcile.Options{Window: since}, repair, stdout)
	}, func(fs *flag.FlagSet) {
		fs.DurationVar(&since, "since", 0, "check only the transfers debited in this window before now, e.g. 1h; 0 checks the whole history")
		fs.BoolVar(&repair, "repair", false,
			"make every missing credit owed again, so that the relay delivers it once (credits without debit are listed, never repaired)")
	})
}
