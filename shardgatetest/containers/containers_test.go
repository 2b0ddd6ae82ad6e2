package containers_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/shardgatetest"
	"github.com/shardgate/shardgate/shardgatetest/containers"
)

// dockerOnly skips a test unless the run asked for containers: these tests are the container
// half of the suite (scripts/test-containers.sh).
func dockerOnly(t *testing.T) {
	if os.Getenv(shardgatetest.BackendEnv) != string(shardgatetest.Docker) {
		t.Skip("set SHARDGATE_TEST_BACKEND=docker to run against containers")
	}
}

// An Env on the Docker backend runs its shards and its router as containers, which ClusterOf
// and RouterOf give as their own types; the router answers.
func TestEnvOnDocker(t *testing.T) {
	dockerOnly(t)
	env := shardgatetest.New(t, shardgatetest.Options{Backend: shardgatetest.Docker})
	c, r := containers.ClusterOf(env), containers.RouterOf(env)
	if env.Backend != shardgatetest.Docker || c == nil || len(c.Shards) != 2 || r == nil {
		t.Fatalf("backend %s, cluster %v, router %v: want docker, two shard containers and a router container", env.Backend, c, r)
	}
	if got := post(t, env, 8842, newKey()); got.status != http.StatusCreated {
		t.Errorf("POST /transfers: %d %s", got.status, got.body)
	}
}

// A shard container cut off the network: its transfers are a retryable 503, and once it is
// connected again the same key applies exactly once (the next send is a replay).
func TestShardCutOffTheNetwork(t *testing.T) {
	dockerOnly(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	env := shardgatetest.New(t, shardgatetest.Options{
		Backend:    shardgatetest.Docker,
		RouterYAML: "shard_pool:\n  connect_timeout: 1s\n  request_timeout: 2s\n",
	})
	shard := containers.ClusterOf(env).Shards[1]
	src := int64(50000)
	for env.Map.Route(src).Shard != shard.Name() {
		src++
	}
	key := newKey()
	if err := shard.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if r := post(t, env, src, key); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "shard-unavailable") || r.retryAfter == "" {
		t.Errorf("cut off: %d %q (Retry-After %q), want 503 shard-unavailable with Retry-After", r.status, r.body, r.retryAfter)
	}
	if err := shard.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	var r reply
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if r = post(t, env, src, key); r.status != http.StatusServiceUnavailable {
			break
		}
	}
	if r.status != http.StatusCreated {
		t.Fatalf("after reconnecting: %d %s, want 201", r.status, r.body)
	}
	if again := post(t, env, src, key); again.status != http.StatusCreated || !again.replayed || again.body != r.body {
		t.Errorf("the same key again: %d replayed=%t %s, want the first answer replayed", again.status, again.replayed, again.body)
	}
}

type reply struct {
	status           int
	body, retryAfter string
	replayed         bool
}

func post(t *testing.T, env *shardgatetest.Env, src int64, key string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, env.URL+"/transfers", bytes.NewBufferString(fmt.Sprintf(`{"src": %d, "dst": 1, "amount": 25}`, src)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+env.Token)
	req.Header.Set("Idempotency-Key", key)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, string(body), resp.Header.Get("Retry-After"), resp.Header.Get("Idempotent-Replayed") == "true"}
}

// newKey is a random UUIDv4.
func newKey() string {
	var b [16]byte
	rand.Read(b[:])
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
