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

// reconcileCommand is `router reconcile --config router.yaml [--older-than 1h]`: a read-only
// check that the ledgers of the map's shards add up (see package reconcile). It prints the
// report to stdout and returns an error, hence exit status 1, when the check found
// discrepancies or could not be made; 2 is for a usage error.
func reconcileCommand(ctx context.Context, args []string, stdout io.Writer) error {
	var olderThan time.Duration
	return withConfig("reconcile", args, stdout, func(cfg *config.Config, m *shardmap.Map) error {
		if olderThan < 0 {
			return fmt.Errorf("%w: reconcile: --older-than must be 0 or more, got %s", errUsage, olderThan)
		}
		return service.Reconcile(ctx, cfg, m, reconcile.Options{OlderThan: olderThan}, stdout)
	}, func(fs *flag.FlagSet) {
		fs.DurationVar(&olderThan, "older-than", reconcile.DefaultOlderThan,
			"a debit older than this without its credit is a discrepancy; a younger one is pending")
	})
}
