package service

import (
	"context"
	"fmt"
	"io"
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
				if _, err := idem.PurgeMoved(ctx, t.Pool(st.Shard), 1000); err != nil && ctx.Err() == nil {
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
