package shardgatetest

import (
	"context"
	"crypto/rand"

	"github.com/shardgate/shardgate/internal/localpg"
)

// localAvailable says why the local backend cannot run here, or nil.
func localAvailable() error {
	_, err := localpg.BinDir()
	return err
}

// startLocalShards starts n local PostgreSQL processes, each with its data in a temp dir that
// Close removes, on a fixed loopback port (kept across Stop and Restart).
func startLocalShards(ctx context.Context, n int) (*ShardSet, error) {
	if err := localAvailable(); err != nil {
		return nil, unavailable(ctx, Local, err, false)
	}
	// One random password for the set: its DSNs carry it, so a test can check it never reaches
	// a log, and connections authenticate with SCRAM as a real deployment's would.
	password := rand.Text()
	servers, err := localpg.StartCluster(ctx, n, localpg.Options{Password: password})
	if err != nil {
		return nil, err
	}
	set := &ShardSet{Backend: Local}
	for i, srv := range servers {
		set.Shards = append(set.Shards, &localShard{name: shardName(i), srv: srv, password: password})
		set.closers = append(set.closers, srv.Close)
	}
	return set, nil
}

var _ Shard = (*localShard)(nil)

// localShard is a Shard run by localpg.
type localShard struct {
	name, password string
	srv            *localpg.Server
}

func (s *localShard) Name() string                      { return s.name }
func (s *localShard) DSN() string                       { return s.srv.DSN() }
func (s *localShard) Password() string                  { return s.password }
func (s *localShard) Stop(ctx context.Context) error    { return s.srv.Stop(ctx) }
func (s *localShard) Restart(ctx context.Context) error { return s.srv.Restart(ctx) }
func (s *localShard) Kill(context.Context) error        { return s.srv.Kill() }
func (s *localShard) Pause(context.Context) error       { return s.srv.Pause() }
func (s *localShard) Resume(context.Context) error      { return s.srv.Resume() }
