//go:build linux

package localpg

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
)

// StartCluster starts n servers in parallel, named shard-0 … shard-<n-1>, and
// returns them in that order. Each gets its own copy of opts, with Dir set to
// opts.Dir/shard-i when opts.Dir is set (else its own temp dir) and Port set
// to opts.Port+i when opts.Port is set (else a free port). If any fails,
// StartCluster closes the ones that started and returns every failure.
func StartCluster(ctx context.Context, n int, opts Options) ([]*Server, error) {
	if n < 1 {
		return nil, fmt.Errorf("localpg: StartCluster needs at least one server, got n=%d", n)
	}
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		o := opts
		o.name = fmt.Sprintf("shard-%d", i)
		if opts.Dir != "" {
			o.Dir = filepath.Join(opts.Dir, o.name)
		}
		if opts.Port != 0 {
			o.Port = opts.Port + i
		}
		wg.Go(func() {
			s, err := Start(ctx, o)
			if err != nil {
				err = fmt.Errorf("%s: %w", o.name, err)
			}
			servers[i], errs[i] = s, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, s := range servers {
			if s != nil {
				err = errors.Join(err, s.Close())
			}
		}
		return nil, err
	}
	return servers, nil
}
