package main

import (
	"context"

	"github.com/shardgate/shardgate/internal/localpg"
)

// startDevShards starts n PostgreSQL shards as local processes with their data under dir and
// returns their DSNs and a function that stops them. A kept dir starts the same clusters again.
func startDevShards(ctx context.Context, n int, dir string) (dsns []string, stop func(), err error) {
	servers, err := localpg.StartCluster(ctx, n, localpg.Options{Dir: dir})
	if err != nil {
		return nil, nil, err
	}
	for _, s := range servers {
		dsns = append(dsns, s.DSN())
	}
	return dsns, func() {
		for _, s := range servers {
			s.Close() //nolint:errcheck // best effort on the way out
		}
	}, nil
}
