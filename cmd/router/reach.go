package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/internal/dsn"
	"github.com/shardgate/shardgate/shardmap"
)

// reachShards connects once to every shard of m, concurrently, before a command that works on
// all of them (migrate, shardmap apply): a shard that cannot be reached is named with its DSN
// (password redacted) and what to check, instead of the driver's error halfway through.
func reachShards(ctx context.Context, cfg *config.Config, m *shardmap.Map) error {
	problems := make([]string, len(m.Shards))
	var wg sync.WaitGroup
	for i, s := range m.Shards {
		wg.Go(func() {
			if err := reachShard(ctx, cfg, s); err != nil {
				problems[i] = err.Error()
			}
		})
	}
	wg.Wait()
	var down []string
	for _, p := range problems {
		if p != "" {
			down = append(down, p)
		}
	}
	if len(down) == 0 {
		return nil
	}
	return fmt.Errorf("%s; nothing was changed on any shard", strings.Join(down, "; "))
}

// reachShard connects to s as the router would (its DSN, router.yaml's connect timeout unless
// the DSN sets one).
func reachShard(ctx context.Context, cfg *config.Config, s shardmap.Shard) error {
	pc, err := dsn.PoolConfig(s.DSN)
	if err != nil {
		return fmt.Errorf("shard %s: dsn: %w", s.Name, err)
	}
	cc := pc.ConnConfig
	if _, set := dsn.Setting(s.DSN, "connect_timeout"); !set {
		cc.ConnectTimeout = cfg.ShardPool.ConnectTimeout
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err == nil {
		return conn.Close(ctx)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("shard %s (%s) cannot be reached: %s: %s", s.Name, dsn.Redact(s.DSN), dsn.Scrub(s.DSN, err.Error()), whatToCheck(err))
}

// whatToCheck words what an operator should look at for a failed connection.
func whatToCheck(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "28P01", "28000":
			return "PostgreSQL refused the login: check the user and password in the shard's DSN (shardmap.yaml), and pg_hba.conf on the shard"
		case "3D000":
			return "the database does not exist: create it on the shard, or fix the database in the shard's DSN (shardmap.yaml)"
		case "53300":
			return "the shard has no connection slots left: raise max_connections there, or lower shard_pool.max_conns"
		}
		return "check the shard's PostgreSQL log"
	}
	return "check that the shard's PostgreSQL is running and listening at that host and port, that this machine can reach it (network, firewall, listen_addresses), and that the DSN in shardmap.yaml is the right one"
}
