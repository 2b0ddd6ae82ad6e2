package service

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/rangemove"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// moveStatusInterval is how often a serving router reads where range moves stand, for its
// metrics, and finishes deleting the rows of ranges moved away that an apply left undone.
const moveStatusInterval = 30 * time.Second

// progressPrinter prints an apply's progress to out: every phase change, and on long work a
// line every progressEvery.
func progressPrinter(out io.Writer) func(rangemove.Progress) {
	const progressEvery = 5 * time.Second
	var last time.Time
	var lastPhase string
	return func(p rangemove.Progress) {
		if p.Phase == lastPhase && time.Since(last) < progressEvery {
			return
		}
		last, lastPhase = time.Now(), p.Phase
		fmt.Fprintln(out, rangemove.FormatProgress(p))
	}
}

// MoveStatus prints where the range moves of m's shards stand (`router shardmap status`), and
// fails if a shard could not be read.
func MoveStatus(ctx context.Context, cfg *config.Config, m *shardmap.Map, out io.Writer) error {
	topo, err := topology.OpenForCommand(m, cfg.ShardPool)
	if err != nil {
		return err
	}
	defer topo.Close()
	if failed := rangemove.PrintStatus(out, rangemove.Status(ctx, m, topo.Pool), time.Now()); failed > 0 {
		return fmt.Errorf("%d shards could not be read", failed)
	}
	return nil
}

// moveStatusLoop reads, every moveStatusInterval, where range moves stand on every shard into
// the router's metrics, and deletes the rows of ranges moved away that an apply left undone.
func (s *Service) moveStatusLoop(ctx context.Context) {
	for {
		t := s.Router.Topology()
		sts := rangemove.Status(ctx, t.Map, t.Pool)
		s.moves.Record(sts)
		for _, st := range sts {
			if len(st.Purges) > 0 {
				if _, err := idem.PurgeMoved(ctx, t.Pool(st.Shard), rangemove.PurgeBatch, s.Config.RangeMoves.Pace); err != nil && ctx.Err() == nil {
					s.log.Warn("deleting the rows of ranges moved away", "shard", st.Shard, "err", err)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(moveStatusInterval):
		}
	}
}

// ApplyMapFile is ApplyMap for the map in file, which routers do not read yet: while the ranges
// are copied they keep the map in place and send the moving ranges to their old owners, which
// serve them; once every shard has revoked what it loses, file is put in place of the map
// router.yaml names (by rename, through a copy beside it), so routers take it up during the
// fence and find the new owners at the grant.
func ApplyMapFile(ctx context.Context, cfg *config.Config, m *shardmap.Map, file string, out io.Writer) error {
	topo, err := topology.OpenForCommand(m, cfg.ShardPool)
	if err != nil {
		return err
	}
	defer topo.Close()
	install := func() error {
		if err := installMap(file, cfg.ShardmapPath); err != nil {
			return fmt.Errorf("put %s in place of %s: %w", file, cfg.ShardmapPath, err)
		}
		fmt.Fprintf(out, "fenced: %s put in place of %s for the routers\n", file, cfg.ShardmapPath)
		return nil
	}
	return applyMapWith(ctx, cfg, m, topo.Pool, out, install)
}

// installMap writes the content of file to path by rename: a copy beside path, then renamed
// over it, so no router reads half a file.
func installMap(file, path string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".shardmap-*.yaml")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close() //nolint:errcheck // the write failed already
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
