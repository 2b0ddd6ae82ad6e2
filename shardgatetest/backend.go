package shardgatetest

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// Backend says where the shards and the router run.
type Backend string

// The backends; see the package documentation.
const (
	// Local runs shards as local PostgreSQL processes and the router in the test process.
	Local Backend = "local"
	// Docker runs shards and the router as containers of locally built images.
	Docker Backend = "docker"
)

// BackendEnv names the environment variable that chooses the backend when Options.Backend is
// empty: "local" or "docker".
const BackendEnv = "SHARDGATE_TEST_BACKEND"

// ErrNoBackend is returned (wrapped, with the reasons) when neither backend can run on this
// machine: no PostgreSQL server binaries, and no Docker Engine with the images.
var ErrNoBackend = errors.New("shardgatetest: no backend can run here: neither PostgreSQL server binaries (install postgresql-15 or set SHARDGATE_PG_BIN) nor the Docker backend (" + ContainerModule + ") with a Docker Engine and the shardgate images (deploy/images/build-*-image.sh)")

// ChooseBackend returns the backend to use: b if set, else $SHARDGATE_TEST_BACKEND, else
// Local where PostgreSQL server binaries are found and Docker otherwise. Any other value is an
// error rather than a silent fallback to another backend.
func ChooseBackend(b Backend) (Backend, error) {
	if b == "" {
		b = Backend(os.Getenv(BackendEnv))
	}
	switch b {
	case Local, Docker:
		return b, nil
	case "":
		if localAvailable() == nil {
			return Local, nil
		}
		return Docker, nil
	}
	return "", fmt.Errorf("shardgatetest: backend %q (Options.Backend or %s): use %q or %q", b, BackendEnv, Local, Docker)
}

// CanSkip reports whether a test that failed to start shardgate with err may skip rather than
// fail: only when no backend can run here (ErrNoBackend) and the environment variable CI is
// unset. In CI a missing backend is a failure, because a skipped test tests nothing.
func CanSkip(err error) bool {
	return errors.Is(err, ErrNoBackend) && os.Getenv("CI") == ""
}

// Available returns the backend an Env started with b runs on (see ChooseBackend), or why it
// cannot run here: an error wrapping ErrNoBackend when the other backend cannot either.
func Available(ctx context.Context, b Backend) (Backend, error) {
	b, err := ChooseBackend(b)
	if err != nil {
		return "", err
	}
	if b == Local {
		err = localAvailable()
	} else {
		err = dockerAvailable(ctx, true)
	}
	if err != nil {
		return b, unavailable(ctx, b, err, true)
	}
	return b, nil
}

// dockerAvailable checks that the Docker backend is linked in, that the Docker Engine answers
// and that the shard image exists, and the router image too when withRouter is set.
func dockerAvailable(ctx context.Context, withRouter bool) error {
	b, err := containers()
	if err != nil {
		return err
	}
	return b.Available(ctx, withRouter)
}

// unavailable is the error of backend b that cannot run here for reason err: it wraps
// ErrNoBackend when the other backend cannot run either, so that callers may skip.
func unavailable(ctx context.Context, b Backend, err error, withRouter bool) error {
	other := localAvailable()
	if b == Local {
		other = dockerAvailable(ctx, withRouter)
	}
	if other == nil {
		return fmt.Errorf("shardgatetest: the %s backend cannot run here: %w", b, err)
	}
	return fmt.Errorf("%w: %s: %w; the other backend: %w", ErrNoBackend, b, err, other)
}
