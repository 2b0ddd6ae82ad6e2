package containers

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver the readiness check uses
	"github.com/moby/moby/api/types/container"
	dockernet "github.com/moby/moby/api/types/network"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/network"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/shardgate/shardgate/internal/localpg"
)

// Label marks every container and network this package creates, so a CI step can sweep what a
// crashed test run left behind: docker rm -f $(docker ps -aq --filter label=dev.shardgate.test=true).
const Label = "dev.shardgate.test"

// DefaultImage is the PostgreSQL image used unless SHARDGATE_PG_IMAGE names another.
const DefaultImage = "shardgate/postgres:15"

// Timeouts of single container operations. Each is also bounded by the caller's context.
const (
	startTimeout = 90 * time.Second // create, first initdb and readiness, on a busy 2-core machine
	opTimeout    = 30 * time.Second // stop, start, pause, network changes
	stopGrace    = 10 * time.Second // SIGINT (fast shutdown) before Docker sends SIGKILL
)

const (
	dbUser = "shardgate"
	dbName = "shardgate"
)

// Image returns the PostgreSQL image the shards run.
func Image() string {
	if img := os.Getenv("SHARDGATE_PG_IMAGE"); img != "" {
		return img
	}
	return DefaultImage
}

// ErrNoImage is returned (wrapped) when the PostgreSQL or the router image is not present locally.
var ErrNoImage = errors.New("image not found locally")

var reaperOnce sync.Once

// disableReaper turns off Ryuk, testcontainers' reaper container: its image cannot be pulled on
// a machine without a registry, and every container here is terminated by Close (and swept by
// Label in CI) instead. testcontainers reads its configuration once, at its first call, so this
// must run before any other testcontainers call; every entry point of this package calls it.
func disableReaper() {
	reaperOnce.Do(func() {
		os.Setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
		// Ports are published on 127.0.0.1 only (a test database has no business on every
		// interface of a CI machine), so that is where readiness checks must dial. Left alone,
		// testcontainers dials the bridge gateway when it runs inside a container.
		if _, set := os.LookupEnv("TESTCONTAINERS_HOST_OVERRIDE"); !set {
			os.Setenv("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")
		}
		if os.Getenv("SHARDGATE_TEST_VERBOSE") == "" {
			// testcontainers narrates every step on stdout; the tests report what matters.
			tclog.SetDefault(tclog.NewNoopLogger())
		}
	})
}

// DockerClient returns a client for the local Docker Engine after checking that the engine answers
// and that image exists locally. Its errors say what to do about them.
func DockerClient(ctx context.Context, image string) (*testcontainers.DockerClient, error) {
	disableReaper()
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return nil, fmt.Errorf("docker: %w (is the Docker Engine running and its socket readable?)", err)
	}
	if _, err := cli.Ping(ctx, client.PingOptions{}); err != nil {
		cli.Close()
		return nil, fmt.Errorf("docker: %w (is the Docker Engine running and its socket readable?)", err)
	}
	// Checked up front: testcontainers would otherwise try to pull a missing image, and retry
	// that for minutes on a machine with no registry.
	if _, err := cli.ImageInspect(ctx, image); err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: %s (%v); build it with deploy/images/build-postgres-image.sh, or set SHARDGATE_PG_IMAGE to an image you have", ErrNoImage, image, err)
	}
	return cli, nil
}

// Cluster is a set of PostgreSQL shard containers on one private network.
type Cluster struct {
	Network *testcontainers.DockerNetwork
	Shards  []*ShardContainer
	cli     *testcontainers.DockerClient

	mu      sync.Mutex
	open    int                               // shards not yet closed; the network goes with the last one
	routers []*testcontainers.DockerContainer // started by StartRouter, terminated by Close
}

// StartCluster starts n shard containers of Image() on a new private network, each with its
// PostgreSQL port published on a fixed 127.0.0.1 port, so that a shard's DSN survives a restart
// and pools opened with it reconnect. On error, whatever was started is removed.
func StartCluster(ctx context.Context, n int) (_ *Cluster, err error) {
	image := Image()
	cli, err := DockerClient(ctx, image)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cli: cli}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	nctx, cancel := context.WithTimeout(ctx, opTimeout)
	c.Network, err = network.New(nctx, network.WithLabels(map[string]string{Label: "true"}))
	cancel()
	if err != nil {
		return nil, fmt.Errorf("create network: %w", err)
	}
	// Started concurrently: each container's initdb is the slow part and they do not interact.
	c.Shards = make([]*ShardContainer, n)
	c.open = n
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c.Shards[i], errs[i] = c.startShard(ctx, image, shardName(i))
		})
	}
	wg.Wait()
	return c, errors.Join(errs...)
}

// startShard starts one shard container, retrying with another port if the chosen one was
// taken between choosing and binding it.
func (c *Cluster) startShard(ctx context.Context, image, alias string) (*ShardContainer, error) {
	var err error
	for range 3 {
		var port int
		if port, err = localpg.FreePort(); err != nil {
			return nil, err
		}
		var s *ShardContainer
		if s, err = c.runShard(ctx, image, alias, port); err == nil {
			return s, nil
		}
		if !portTaken(err) {
			break
		}
	}
	return nil, fmt.Errorf("start %s: %w", alias, err)
}

// portTaken reports a start that failed because the host port was bound meanwhile.
func portTaken(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "port is already allocated") || strings.Contains(msg, "address already in use")
}

func (c *Cluster) runShard(ctx context.Context, image, alias string, port int) (*ShardContainer, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	password := rand.Text() // per container; it appears only inside DSNs, which are never logged
	s := &ShardContainer{cluster: c, Alias: alias, port: port, password: password}
	pgPort := dockernet.MustParsePort("5432/tcp")
	ctr, err := tcpostgres.Run(ctx, image,
		tcpostgres.WithUsername(dbUser),
		tcpostgres.WithPassword(password),
		tcpostgres.WithDatabase(dbName),
		// Trust, as the local backend uses: SCRAM's deliberately slow key derivation, run by
		// both sides under the race detector on a busy 2-core machine, outlasted the suite's
		// connect timeout when a pool opened 20 connections at once. The port is published on
		// loopback only, and the password stays in the DSN for images that ignore this.
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
		network.WithNetwork([]string{alias}, c.Network),
		testcontainers.WithLabels(map[string]string{Label: "true"}),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			hc.PortBindings = dockernet.PortMap{pgPort: {{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: strconv.Itoa(port)}}}
		}),
		testcontainers.WithWaitStrategy(wait.ForAll(
			wait.ForListeningPort("5432/tcp"),
			// A listening port is not enough: the server may still be recovering.
			wait.ForSQL("5432/tcp", "pgx", func(host string, p dockernet.Port) string {
				return s.dsnAt(host, p.Port())
			}).WithQuery("SELECT 1"),
		).WithStartupTimeoutDefault(startTimeout)),
	)
	if ctr != nil {
		s.ctr = ctr
	}
	if err != nil {
		if ctr != nil {
			ctr.Terminate(context.WithoutCancel(ctx)) //nolint:errcheck // best effort; the start error is what matters
		}
		return nil, err
	}
	if err := s.checkPort(ctx); err != nil {
		ctr.Terminate(context.WithoutCancel(ctx)) //nolint:errcheck // best effort
		return nil, err
	}
	return s, nil
}

// Close terminates every router and shard still open and removes the network.
func (c *Cluster) Close() error {
	errs := []error{c.terminateRouters()}
	for _, s := range c.Shards {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	c.mu.Lock()
	c.open = 0
	c.mu.Unlock()
	errs = append(errs, c.removeNetwork())
	if c.cli != nil {
		errs = append(errs, c.cli.Close())
		c.cli = nil
	}
	return errors.Join(errs...)
}

func (c *Cluster) removeNetwork() error {
	if c.Network == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	err := c.Network.Remove(ctx)
	c.Network = nil
	return err
}

// ShardContainer is one PostgreSQL shard as a container: a [Shard] that can also be cut off
// the network. Its methods are safe for concurrent use.
type ShardContainer struct {
	// Alias is the shard's host name on the cluster network (shard-0, shard-1, ...).
	Alias    string
	cluster  *Cluster
	password string

	mu     sync.Mutex
	ctr    *tcpostgres.PostgresContainer
	port   int // fixed host port on 127.0.0.1
	closed bool
}

// Name is the shard's name in the shard map, also its host name on the cluster network.
func (s *ShardContainer) Name() string { return s.Alias }

// DSN is the shard's connection string from the host. It stays the same across Stop, Kill and
// Restart because the host port is bound explicitly.
func (s *ShardContainer) DSN() string { return s.dsnAt("127.0.0.1", strconv.Itoa(s.port)) }

// Password is the shard's database password, random per container; a test can check that it
// never reaches a log.
func (s *ShardContainer) Password() string { return s.password }

func (s *ShardContainer) dsnAt(host, port string) string {
	return fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable", dbUser, s.password, net.JoinHostPort(host, port), dbName)
}

// Stop shuts the server down cleanly (SIGINT, PostgreSQL's fast shutdown) and stops the container.
func (s *ShardContainer) Stop(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	grace := stopGrace
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.ctr.Stop(ctx, &grace); err != nil {
		return fmt.Errorf("stop %s: %w", s.Alias, err)
	}
	return nil
}

// Kill sends SIGKILL: the server dies without a shutdown checkpoint, as in a crash.
func (s *ShardContainer) Kill(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	return kill(ctx, s.cluster.cli, s.ctr, s.Alias)
}

// kill sends ctr SIGKILL and waits until Docker reports it stopped, so a following Start does
// not race the kill.
func kill(ctx context.Context, cli *testcontainers.DockerClient, ctr testcontainers.Container, name string) error {
	if _, err := cli.ContainerKill(ctx, ctr.GetContainerID(), client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		return fmt.Errorf("kill %s: %w", name, err)
	}
	for {
		st, err := ctr.State(ctx)
		if err != nil {
			return fmt.Errorf("state of %s: %w", name, err)
		}
		if !st.Running {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s still running: %w", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Restart starts the stopped or killed container again and waits until it answers SQL.
func (s *ShardContainer) Restart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.ctr.Start(ctx); err != nil {
		return fmt.Errorf("restart %s: %w", s.Alias, err)
	}
	return s.checkPort(ctx)
}

// checkPort confirms Docker published the port DSN names: a pool opened with the DSN must
// reach the same server after every restart.
func (s *ShardContainer) checkPort(ctx context.Context) error {
	p, err := s.ctr.MappedPort(ctx, "5432/tcp")
	if err != nil {
		return fmt.Errorf("%s: mapped port: %w", s.Alias, err)
	}
	if int(p.Num()) != s.port {
		return fmt.Errorf("%s: published on port %d, not the bound %d", s.Alias, p.Num(), s.port)
	}
	return nil
}

// Pause freezes every process of the container (cgroup freezer): connections stay open and
// stall, as with a server hung on I/O or a long GC-like stop.
func (s *ShardContainer) Pause(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := s.cluster.cli.ContainerPause(ctx, s.ctr.GetContainerID(), client.ContainerPauseOptions{}); err != nil {
		return fmt.Errorf("pause %s: %w", s.Alias, err)
	}
	return nil
}

// Resume unpauses a paused container.
func (s *ShardContainer) Resume(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := s.cluster.cli.ContainerUnpause(ctx, s.ctr.GetContainerID(), client.ContainerUnpauseOptions{}); err != nil {
		return fmt.Errorf("unpause %s: %w", s.Alias, err)
	}
	return nil
}

// Disconnect cuts the container off the cluster network. Its published port goes with it, so
// clients on the host lose it too: established connections stall, new ones fail.
func (s *ShardContainer) Disconnect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := s.cluster.cli.NetworkDisconnect(ctx, s.cluster.Network.ID, client.NetworkDisconnectOptions{Container: s.ctr.GetContainerID(), Force: true}); err != nil {
		return fmt.Errorf("disconnect %s: %w", s.Alias, err)
	}
	return nil
}

// Connect reattaches the container to the cluster network under its alias.
func (s *ShardContainer) Connect(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if _, err := s.cluster.cli.NetworkConnect(ctx, s.cluster.Network.ID, client.NetworkConnectOptions{
		Container:      s.ctr.GetContainerID(),
		EndpointConfig: &dockernet.EndpointSettings{Aliases: []string{s.Alias}},
	}); err != nil {
		return fmt.Errorf("connect %s: %w", s.Alias, err)
	}
	return nil
}

// Close terminates (stops and removes) the container; the last shard to close also removes the
// cluster's network. Closing twice is harmless.
func (s *ShardContainer) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	// A paused container cannot be stopped; unpausing one that is not paused fails harmlessly.
	s.cluster.cli.ContainerUnpause(ctx, s.ctr.GetContainerID(), client.ContainerUnpauseOptions{}) //nolint:errcheck // see above
	err := s.ctr.Terminate(ctx, testcontainers.StopTimeout(stopGrace))
	if err != nil {
		err = fmt.Errorf("terminate %s: %w", s.Alias, err)
	}
	c := s.cluster
	c.mu.Lock()
	c.open--
	last := c.open == 0
	c.mu.Unlock()
	if last {
		err = errors.Join(err, c.removeNetwork())
	}
	return err
}
