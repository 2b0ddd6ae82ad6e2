package containers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/moby/moby/api/types/container"
	dockernet "github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/shardgate/shardgate/internal/localpg"
	"github.com/shardgate/shardgate/shardgatetest"
)

// DefaultRouterImage is the router image used unless SHARDGATE_ROUTER_IMAGE names another; it
// is built by deploy/images/build-router-image.sh.
const DefaultRouterImage = "shardgate/router:dev"

// RouterImage returns the router image StartRouter runs.
func RouterImage() string {
	if img := os.Getenv("SHARDGATE_ROUTER_IMAGE"); img != "" {
		return img
	}
	return DefaultRouterImage
}

// NetworkDSN is the shard's connection string from inside the cluster network, for a router
// running there as a container: the shard's alias and PostgreSQL's own port.
func (s *ShardContainer) NetworkDSN() string { return s.dsnAt(s.Alias, "5432") }

// RouterContainer is the router image running as a container on the cluster network, as users
// deploy it. Its API port is published on a fixed 127.0.0.1 port, so its address survives Kill and Restart.
type RouterContainer struct {
	cluster *Cluster
	port    int

	mu  sync.Mutex
	ctr *testcontainers.DockerContainer
}

// StartRouter runs `router serve` from RouterImage() on the cluster network with the given
// router.yaml and shard map (mounted as shardgatetest.RouterConfigDir/router.yaml and /shardmap.yaml; the
// router.yaml must listen on 0.0.0.0:8080 and name shardmap.yaml), and waits until it is ready.
// The shard map's DSNs should be the shards' NetworkDSNs.
func (c *Cluster) StartRouter(ctx context.Context, routerYAML, shardmapYAML []byte) (*RouterContainer, error) {
	if err := checkRouterImage(ctx, c.cli); err != nil {
		return nil, err
	}
	image := RouterImage()
	var err error
	for range 3 {
		var port int
		if port, err = localpg.FreePort(); err != nil {
			return nil, err
		}
		var r *RouterContainer
		if r, err = c.runRouter(ctx, image, port, routerYAML, shardmapYAML); err == nil {
			return r, nil
		}
		if !portTaken(err) {
			break
		}
	}
	return nil, fmt.Errorf("start router: %w", err)
}

func (c *Cluster) runRouter(ctx context.Context, image string, port int, routerYAML, shardmapYAML []byte) (*RouterContainer, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	apiPort := dockernet.MustParsePort("8080/tcp")
	file := func(name string, data []byte) testcontainers.ContainerFile {
		// World-readable: the image runs as uid 65532 and Docker writes the files as root.
		return testcontainers.ContainerFile{Reader: bytes.NewReader(data), ContainerFilePath: shardgatetest.RouterConfigDir + "/" + name, FileMode: 0o644}
	}
	ctr, err := testcontainers.Run(ctx, image,
		testcontainers.WithCmd("serve", "--config", shardgatetest.RouterConfigDir+"/router.yaml"),
		testcontainers.WithFiles(file("router.yaml", routerYAML), file("shardmap.yaml", shardmapYAML)),
		testcontainers.WithExposedPorts("8080/tcp"),
		network.WithNetwork([]string{"router"}, c.Network),
		testcontainers.WithLabels(map[string]string{Label: "true"}),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.PortBindings = dockernet.PortMap{apiPort: {{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(port)}}}
		}),
		// partial=1: a restart must not wait for a shard that is down at that moment.
		testcontainers.WithWaitStrategy(wait.ForHTTP("/readyz?partial=1").WithPort("8080/tcp").
			WithStartupTimeout(startTimeout).WithPollInterval(100*time.Millisecond)),
	)
	if err != nil {
		if ctr != nil {
			ctr.Terminate(context.WithoutCancel(ctx)) //nolint:errcheck // best effort; the start error is what matters
		}
		return nil, err
	}
	c.mu.Lock()
	c.routers = append(c.routers, ctr)
	c.mu.Unlock()
	return &RouterContainer{cluster: c, port: port, ctr: ctr}, nil
}

// Addr is the router's API address on the host.
func (r *RouterContainer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Kill sends SIGKILL, as when a node dies or the OOM killer strikes: connections to clients and
// shards are cut mid-request and nothing shuts down cleanly.
func (r *RouterContainer) Kill(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	return kill(ctx, r.cluster.cli, r.ctr, "router")
}

// Restart starts the killed router again and waits until it is ready.
func (r *RouterContainer) Restart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.ctr.Start(ctx); err != nil {
		return fmt.Errorf("restart router: %w", err)
	}
	return nil
}

// Logs returns what the router wrote to stdout and stderr, over all its runs.
func (r *RouterContainer) Logs(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	rc, err := r.ctr.Logs(ctx)
	if err != nil {
		return "", fmt.Errorf("router logs: %w", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	return string(b), err
}

// checkRouterImage fails unless RouterImage() exists locally: testcontainers would otherwise
// try to pull it, and retry that for minutes on a machine with no registry.
func checkRouterImage(ctx context.Context, cli *testcontainers.DockerClient) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	image := RouterImage()
	if _, err := cli.ImageInspect(ctx, image); err != nil {
		return fmt.Errorf("%w: %s (%v); build it with deploy/images/build-router-image.sh, or set SHARDGATE_ROUTER_IMAGE to an image you have", ErrNoImage, image, err)
	}
	return nil
}

// terminateRouters removes every router container the cluster started; Close calls it before
// the shards and the network go.
func (c *Cluster) terminateRouters() error {
	c.mu.Lock()
	routers := c.routers
	c.routers = nil
	c.mu.Unlock()
	var errs []error
	for _, ctr := range routers {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		errs = append(errs, ctr.Terminate(ctx))
		cancel()
	}
	return errors.Join(errs...)
}
