package router

import (
	"errors"
	"fmt"

	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// ReloadResult labels shardgate_shardmap_reloads_total.
type ReloadResult string

// The results of Reload.
const (
	ReloadApplied   ReloadResult = "applied"
	ReloadUnchanged ReloadResult = "unchanged"
	ReloadRefused   ReloadResult = "refused"
)

// ErrMapRefused wraps every reason a new shard map is not applied.
var ErrMapRefused = errors.New("shard map refused")

// Reload reads the shard map at path and, if it is valid and its version is higher, opens pools
// for new shards and swaps it in; requests already routed finish on the old map, and pools of
// shards that left are closed once their in-flight requests end. An invalid map, a lower
// version, or other shards or ranges under the same version are refused and the current map
// keeps serving; a map that changes only DSNs is taken under the same version. Reloads are
// serialized.
func (s *Server) Reload(path string) (ReloadResult, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	was := s.topo.Load().Map
	res, err := s.reload(path)
	s.metrics.reloads.WithLabelValues(string(res)).Inc()
	switch res {
	case ReloadApplied:
		s.mapSwapped(was)
		s.log.Info("shard map reloaded", "version", s.topo.Load().Map.Version)
	case ReloadRefused:
		s.log.Error("shard map reload refused; the current map keeps serving", "version", s.topo.Load().Map.Version, "err", err)
	}
	return res, err
}

func (s *Server) reload(path string) (ReloadResult, error) {
	m, err := shardmap.Load(path)
	if err != nil {
		return ReloadRefused, fmt.Errorf("%w: %w", ErrMapRefused, err)
	}
	cur := s.topo.Load()
	d := shardmap.Compare(cur.Map, m)
	switch {
	case m.Version < cur.Map.Version:
		return ReloadRefused, fmt.Errorf("%w: version %d is lower than the serving version %d; a router never goes back", ErrMapRefused, m.Version, cur.Map.Version)
	case m.Version == cur.Map.Version && len(d.Moves) == 0 && len(d.Added) == 0 && len(d.Removed) == 0:
		if len(d.DSNChanged) == 0 {
			return ReloadUnchanged, nil
		}
		// Only connection strings changed: who owns what is the same, so the version need not
		// move. This is also what lets the complete file in after a half-written one whose cut
		// DSN happened to be valid: refusing it would leave that shard unreachable until
		// someone raised the version.
	case m.Version == cur.Map.Version:
		return ReloadRefused, fmt.Errorf("%w: the map's shards or ranges changed but its version is still %d; raise the version", ErrMapRefused, m.Version)
	}
	next, err := topology.Open(m, cur, s.cfg.ShardPool)
	if err != nil {
		return ReloadRefused, fmt.Errorf("%w: %w", ErrMapRefused, err)
	}
	s.topo.Store(next)
	s.groups.forget(next)
	for _, name := range d.Added {
		s.metrics.identities.WithLabelValues(name)
	}
	for _, name := range d.DSNChanged {
		// A shard repointed is often a shard failed over: until its new database's identity is
		// read, what it answered before is not trusted.
		s.replays.dropShard(name)
	}
	go cur.Retire(next)
	return ReloadApplied, nil
}
