package main

import (
	"context"
	"io"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/service"
	"github.com/shardgate/shardgate/shardmap"
)

// shardmapStatus prints, for every shard of the map router.yaml names, what it owns, each range
// moving out of it with its phase and progress, and the moved ranges it still deletes rows of.
func shardmapStatus(ctx context.Context, args []string, stdout io.Writer) error {
	return withConfig("shardmap status", args, stdout, func(cfg *config.Config, m *shardmap.Map) error {
		return service.MoveStatus(ctx, cfg, m, stdout)
	})
}
