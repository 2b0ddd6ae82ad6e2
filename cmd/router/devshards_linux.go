package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/shardgate/shardgate/internal/localpg"
)

// startDevShards starts n PostgreSQL shards as local processes with their data under dir and
// returns their DSNs and a function that stops them. A kept dir starts the same clusters again.
// With standby, each shard also gets a synchronous streaming standby, made afresh in a temporary
// directory, and its DSN names both servers with target_session_attrs=read-write, so that the
// router follows a promotion without a change to the map.
func startDevShards(ctx context.Context, n int, dir string, standby bool, out io.Writer) (dsns []string, stop func(), err error) {
	servers, err := localpg.StartCluster(ctx, n, localpg.Options{Dir: dir})
	if err != nil {
		return nil, nil, err
	}
	all := servers
	stop = func() {
		for _, s := range all {
			s.Close() //nolint:errcheck // best effort on the way out
		}
	}
	for i, s := range servers {
		if !standby {
			dsns = append(dsns, s.DSN())
			continue
		}
		sb, err := s.StartStandby(ctx, localpg.StandbyOptions{Sync: true, Name: fmt.Sprintf("shard%d_standby", i)})
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("shard-%d: %w", i, err)
		}
		all = append(all, sb)
		fmt.Fprintf(out, "shard-%d: primary on port %d, synchronous standby on port %d (data %s; promote it with: SELECT pg_promote())\n",
			i, s.Port(), sb.Port(), sb.Dir())
		dsns = append(dsns, strings.Replace(s.DSN(), fmt.Sprintf("127.0.0.1:%d", s.Port()), fmt.Sprintf("127.0.0.1:%d,127.0.0.1:%d", s.Port(), sb.Port()), 1)+
			"&target_session_attrs=read-write")
	}
	return dsns, stop, nil
}
