package shardgatetest

import (
	"crypto/sha256"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/shardmap"
)

func TestOptionsDefaults(t *testing.T) {
	for _, c := range []struct {
		name         string
		in           Options
		shards       int
		ranges       [][]string
		replayWindow time.Duration
		err          string
	}{
		{name: "zero", shards: 2, ranges: [][]string{{"-80"}, {"80-"}}, replayWindow: 168 * time.Hour},
		{name: "shards", in: Options{Shards: 3}, shards: 3, ranges: [][]string{{"-55"}, {"55-aa"}, {"aa-"}}, replayWindow: 168 * time.Hour},
		{name: "ranges give the count", in: Options{Ranges: [][]string{{"-40", "c0-"}, {"40-c0"}}}, shards: 2,
			ranges: [][]string{{"-40", "c0-"}, {"40-c0"}}, replayWindow: 168 * time.Hour},
		{name: "short retention", in: Options{Retention: 48 * time.Hour}, shards: 2, ranges: [][]string{{"-80"}, {"80-"}}, replayWindow: 24 * time.Hour},
		{name: "count and ranges disagree", in: Options{Shards: 3, Ranges: [][]string{{"-"}}}, err: "Options.Ranges lists 1"},
		{name: "too many", in: Options{Shards: MaxShards + 1}, err: "use 1 to 16"},
		{name: "negative", in: Options{Shards: -1}, err: "use 1 to 16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			o, err := c.in.withDefaults()
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one mentioning %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.Shards != c.shards || !slices.EqualFunc(o.Ranges, c.ranges, slices.Equal) || o.ReplayWindow != c.replayWindow {
				t.Errorf("%d shards %v, replay window %s; want %d %v %s", o.Shards, o.Ranges, o.ReplayWindow, c.shards, c.ranges, c.replayWindow)
			}
			if len(o.Clients) != 1 || len(o.Clients[DefaultClient]) < 20 {
				t.Errorf("clients %v: want %s with a random token", o.Clients, DefaultClient)
			}
		})
	}
	mine := map[string]string{"a": "token-a"}
	o, _ := Options{Clients: mine}.withDefaults()
	mine["b"] = "token-b"
	if len(o.Clients) != 1 {
		t.Error("the options share the caller's client map")
	}
}

// Every even split is a valid map that routes to every shard.
func TestEvenRangesCoverTheKeyspace(t *testing.T) {
	for n := 1; n <= MaxShards; n++ {
		dsns := make([]string, n)
		for i := range dsns {
			dsns[i] = "postgres://u@h/db"
		}
		m, err := shardmap.Parse("shardmap.yaml", shardmapYAML(dsns, evenRanges(n)), nil)
		if err != nil {
			t.Fatalf("%d shards: %v", n, err)
		}
		for i, s := range m.Shards {
			if s.Name != shardName(i) || len(s.Ranges) != 1 {
				t.Errorf("%d shards: shard %d is %v", n, i, s)
			}
		}
	}
}

func TestRouterYAML(t *testing.T) {
	o, err := Options{
		Clients:    map[string]string{"payments": "tok-1", "ledger.audit": "tok-2"},
		Retention:  48 * time.Hour,
		RouterYAML: "idempotency:\n  in_progress_retry_after: 2s\nshard_pool:\n  request_timeout: 1500ms\n",
	}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	yml, err := routerYAML(o, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse("/tmp/x/router.yaml", yml)
	if err != nil {
		t.Fatalf("%v\n%s", err, yml)
	}
	idm := cfg.Idempotency
	if idm.Retention != 48*time.Hour || idm.ReplayWindow != 24*time.Hour || idm.InProgressRetryAfter != 2*time.Second ||
		cfg.ShardPool.RequestTimeout != 1500*time.Millisecond || cfg.ShardmapPath != "/tmp/x/shardmap.yaml" {
		t.Errorf("merged config: %+v %+v %s", idm, cfg.ShardPool, cfg.ShardmapPath)
	}
	if len(cfg.Auth.Clients) != 2 || cfg.Auth.Clients[0].Name != "ledger.audit" || cfg.Auth.Clients[1].TokenSHA256 != sha256.Sum256([]byte("tok-1")) {
		t.Errorf("clients %+v", cfg.Auth.Clients)
	}
	for extra, want := range map[string]string{
		"auth:\n  mode: none\n":    `sets "auth"`,
		"listen: 0.0.0.0:1\n":      `sets "listen"`,
		"- a\n":                    "must be a YAML mapping",
		"shard_pool: [\n":          "Options.RouterYAML",
		"shard_pool:\n  nope: 1\n": "nope",
	} {
		o.RouterYAML = extra
		yml, err := routerYAML(o, "127.0.0.1:0")
		if err == nil {
			_, err = config.Parse("router.yaml", yml)
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("RouterYAML %q: %v, want an error mentioning %q", extra, err, want)
		}
	}
}

func TestTailBufferKeepsTheEnd(t *testing.T) {
	b := &tailBuffer{max: 100}
	for i := range 1000 {
		b.Write([]byte(strings.Repeat("x", i%7) + "line\n"))
	}
	b.Write([]byte("last\n"))
	s := b.String()
	if len(s) > 200 || !strings.HasSuffix(s, "line\nlast\n") || strings.Contains(s, "\n\n") {
		t.Errorf("%d bytes %q", len(s), s)
	}
	if !strings.HasSuffix(strings.SplitN(s, "\n", 2)[0], "line") {
		t.Errorf("the kept log starts mid-line: %q", s[:20])
	}
}

func TestChooseBackend(t *testing.T) {
	t.Setenv(BackendEnv, "docker")
	if b, err := ChooseBackend(""); b != Docker || err != nil {
		t.Errorf("from the environment: %q %v", b, err)
	}
	if b, err := ChooseBackend(Local); b != Local || err != nil {
		t.Errorf("explicit: %q %v", b, err)
	}
	t.Setenv(BackendEnv, "podman")
	if _, err := ChooseBackend(""); err == nil || !strings.Contains(err.Error(), `"podman"`) {
		t.Errorf("unknown backend: %v", err)
	}
	t.Setenv(BackendEnv, "")
	want := Docker
	if localAvailable() == nil {
		want = Local
	}
	if b, err := ChooseBackend(""); b != want || err != nil {
		t.Errorf("default: %q %v, want %q", b, err, want)
	}
}
