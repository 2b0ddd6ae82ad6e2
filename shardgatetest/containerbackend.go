package shardgatetest

import (
	"context"
	"errors"
	"sync"
)

// ContainerModule is the Go module of the Docker backend. It is a module of its own so that
// tests on the local backend do not depend on testcontainers-go and Docker's client; a test
// that runs on Docker imports it, which registers the backend:
//
//	import _ "github.com/shardgate/shardgate/shardgatetest/containers"
const ContainerModule = "github.com/shardgate/shardgate/shardgatetest/containers"

// RouterConfigDir is where the Docker backend puts router.yaml and the shard map in the router
// container.
const RouterConfigDir = "/etc/shardgate"

// ContainerBackend runs shards and the router as containers: the Docker backend, provided by
// [ContainerModule] and registered with [RegisterContainerBackend].
type ContainerBackend interface {
	// Available says why the shard image, and the router image too when withRouter is set,
	// cannot run here; nil when they can.
	Available(ctx context.Context, withRouter bool) error
	// StartShards starts n empty shard containers, shard-0 first, on a private network.
	StartShards(ctx context.Context, n int) (ContainerShards, error)
}

// ContainerShards are the shard containers of the Docker backend. ClusterOf in
// [ContainerModule] gives its own type, with the faults only containers have (cutting a shard
// off the network).
type ContainerShards interface {
	// Shards are the shards, shard-0 first.
	Shards() []Shard
	// StartRouter runs the router image on the shards' network with routerYAML (mounted at
	// RouterConfigDir/router.yaml) and the shard map that shardmapYAML makes of the shards'
	// DSNs as seen on that network, and returns once it is ready.
	StartRouter(ctx context.Context, routerYAML []byte, shardmapYAML func(dsns []string) []byte) (ContainerRouter, error)
	// Close removes the containers and the network.
	Close() error
}

// ContainerRouter is the router running as a container. RouterOf in [ContainerModule] gives
// its own type, which can be killed and restarted.
type ContainerRouter interface {
	// Addr is the router's API address on the host.
	Addr() string
	// Logs is what the router wrote, over all its runs.
	Logs(ctx context.Context) (string, error)
}

var (
	containerMu      sync.Mutex
	containerBackend ContainerBackend
)

// RegisterContainerBackend makes b the Docker backend. [ContainerModule] calls it when it is
// imported.
func RegisterContainerBackend(b ContainerBackend) {
	containerMu.Lock()
	defer containerMu.Unlock()
	containerBackend = b
}

// errNoContainerModule: the Docker backend was chosen and the test does not import its module.
var errNoContainerModule = errors.New("the docker backend is in its own module: add it with go get " + ContainerModule +
	" and import it in the test (import _ \"" + ContainerModule + "\")")

// containers returns the registered Docker backend, or why there is none.
func containers() (ContainerBackend, error) {
	containerMu.Lock()
	defer containerMu.Unlock()
	if containerBackend == nil {
		return nil, errNoContainerModule
	}
	return containerBackend, nil
}
