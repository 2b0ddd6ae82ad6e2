//go:build !linux

package shardgatetest

import (
	"context"
	"errors"
)

// errLocalNeedsLinux: local PostgreSQL processes are controlled through Linux-only means
// (parent-death signals, /proc); see internal/localpg.
var errLocalNeedsLinux = errors.New("the local backend needs Linux; use the docker backend")

func localAvailable() error { return errLocalNeedsLinux }

func startLocalShards(ctx context.Context, _ int) (*ShardSet, error) {
	return nil, unavailable(ctx, Local, errLocalNeedsLinux, false)
}
