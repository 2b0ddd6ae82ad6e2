package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/partition"
)

const validYAML = `listen: 127.0.0.1:8080
shardmap: shardmap.yaml
idempotency:
  retention: 720h
  partition_interval: 24h
  replay_window: 168h
  in_progress_retry_after: 1s
auth:
  mode: tokens
  clients:
    - name: payments-api
      token_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
`

func TestParseValid(t *testing.T) {
	c, err := Parse("/etc/shardgate/router.yaml", []byte(validYAML))
	if err != nil {
		t.Fatal(err)
	}
	if c.ShardmapPath != filepath.FromSlash("/etc/shardgate/shardmap.yaml") {
		t.Errorf("shardmap path %q is not relative to router.yaml", c.ShardmapPath)
	}
	if c.Idempotency.Retention != 720*time.Hour || c.Idempotency.PartitionInterval != partition.Daily ||
		c.Idempotency.InProgressRetryAfter != time.Second || c.Transfers.DefaultCurrency != "EUR" {
		t.Errorf("unexpected values: %+v", c)
	}
	if gc := c.GroupCommit; gc.MaxBatch != 64 || gc.InFlight != 1 || gc.MaxInFlight != 4 || gc.StallAfter != 20*time.Millisecond {
		t.Errorf("group_commit %+v, want the defaults: max_batch 64 (on), in_flight 1, max_in_flight 4, stall_after 20ms", gc)
	}
	if len(c.Auth.Clients) != 1 || c.Auth.Clients[0].Name != "payments-api" || c.Auth.Clients[0].TokenSHA256[0] != 0x9f {
		t.Errorf("clients: %+v", c.Auth.Clients)
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", validYAML + "colour: blue\n", "line 13: colour is not a setting (router.yaml takes admin, auth, group_commit,"},
		{"unknown nested key", strings.Replace(validYAML, "  retention: 720h", "  retension: 720h", 1),
			"line 4: idempotency.retension is not a setting; did you mean retention? (idempotency takes in_progress_retry_after, partition_interval, partitions_ahead, replay_window, retention)"},
		{"unknown key in a list item", strings.Replace(validYAML, "token_sha256:", "token:", 1), "line 12: auth.clients[0].token is not a setting (auth.clients[0] takes name, token_sha256)"},
		{"unknown key merged in", "defaults: &d {max_batch: 8, colour: blue}\n", "line 1: defaults is not a setting"},
		{"unknown key merged into a section", "group_commit:\n  <<: {max_batch: 8, colour: blue}\n", "line 2: group_commit.colour is not a setting (group_commit takes in_flight, max_batch, max_in_flight, stall_after), merged in at line 2"},
		{"text for a number", validYAML + "group_commit:\n  max_batch: many\n", `line 14: group_commit.max_batch: "many" is not a whole number`},
		{"text for a switch", validYAML + "relay:\n  enabled: sometimes\n", `line 14: relay.enabled: "sometimes" is not true or false`},
		{"a list for a section", validYAML + "group_commit: [8]\n", "line 13: group_commit: a list is not a mapping of settings"},
		{"a number for a section", validYAML + "transfers: 3\n", `line 13: transfers: "3" is not a mapping of settings`},
		{"a mapping for a list", "auth:\n  mode: tokens\n  clients: {}\n", "line 3: auth.clients: a mapping is not a list"},
		{"a fraction for a whole number", validYAML + "group_commit:\n  max_batch: 1.5\n", `line 14: group_commit.max_batch: "1.5" is not a whole number`},
		{"a number out of range", validYAML + "shard_pool:\n  max_conns: 3000000000\n", `line 14: shard_pool.max_conns: "3000000000" is out of range (-2147483648 to 2147483647)`},
		{"flow style, the second key wrong", validYAML + "relay: {batch: 8, enabled: maybe}\n", `line 13: relay.enabled: "maybe" is not true or false`},
		{"a list for a duration", validYAML + "relay:\n  lease: [1s]\n", "line 14: relay.lease: a list is not a duration"},
		{"an anchor merged where its keys do not belong", validYAML + "relay: &r\n  enabled: true\ngroup_commit:\n  <<: *r\n",
			"line 14: group_commit.enabled is not a setting (group_commit takes in_flight, max_batch, max_in_flight, stall_after), merged in at line 16"},
		{"a list aliased into itself", "auth:\n  mode: tokens\n  clients: &c [{name: a, token_sha256: x}, *c]\n", "line 3: auth.clients[1]: a list is not a mapping of settings"},
		{"a key that would forge a line", validYAML + "\"a\\nline 99: forged\": 1\n", `line 13: "a\nline 99: forged" is not a setting`},
		{"retention below twice replay window", strings.Replace(validYAML, "retention: 720h", "retention: 300h", 1), "less than twice replay_window"},
		{"bad duration", strings.Replace(validYAML, "retention: 720h", "retention: 30 days", 1), "not a duration"},
		{"unsupported interval", strings.Replace(validYAML, "partition_interval: 24h", "partition_interval: 6h", 1), "partition_interval"},
		{"retry-after below a second", strings.Replace(validYAML, "in_progress_retry_after: 1s", "in_progress_retry_after: 200ms", 1), "below 1s"},
		{"bad token hash", strings.Replace(validYAML, "9f86d081", "zz86d081", 1), "64 hex digits"},
		{"bad mode", strings.Replace(validYAML, "mode: tokens", "mode: maybe", 1), `"maybe" must be tokens or none`},
		{"tokens without clients", "auth:\n  mode: tokens\n", "at least one client"},
		{"bad client name", strings.Replace(validYAML, "payments-api", "Payments API", 1), "must be 1-63"},
		{"duplicate client", validYAML + "    - name: payments-api\n      token_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n", "listed twice"},
		{"none with clients", strings.Replace(validYAML, "mode: tokens", "mode: none", 1), "given with mode none"},
		{"replay cache outliving the replay window", validYAML + "replay_cache:\n  ttl: 200h\n", "replay_cache.ttl: 200h0m0s must be positive and below"},
		{"group of none", validYAML + "group_commit:\n  max_batch: 0\n", "group_commit.max_batch: 0 must be between 1"},
		{"no group in flight", validYAML + "group_commit:\n  in_flight: 0\n", "group_commit.in_flight: 0 must be between 1 and 1000"},
		{"fewer in flight in all than without stalls", validYAML + "group_commit:\n  in_flight: 3\n  max_in_flight: 2\n", "group_commit.max_in_flight: 2 must be between group_commit.in_flight (3) and 1000"},
		{"groups never stall", validYAML + "group_commit:\n  stall_after: 0s\n", "group_commit.stall_after: 0s must be positive"},
		{"stall beyond the request timeout", validYAML + "group_commit:\n  stall_after: 5s\n", "group_commit.stall_after: 5s must be positive and below shard_pool.request_timeout (5s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("router.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestParseNamesEveryMistypedValue: the decoder's problems are reported together, each by its
// key, and no Go type leaks into them.
func TestParseNamesEveryMistypedValue(t *testing.T) {
	y := validYAML + "group_commit:\n  max_batch: many\n  stall_after: soon\nshard_pool:\n  max_conns: -x\n"
	_, err := Parse("router.yaml", []byte(y))
	if err == nil {
		t.Fatal("want an error")
	}
	for _, want := range []string{`group_commit.max_batch: "many" is not a whole number`, `group_commit.stall_after: "soon" is not a duration`, `shard_pool.max_conns: "-x" is not a whole number`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "int32") || strings.Contains(err.Error(), "struct") {
		t.Errorf("error %q names Go types", err)
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	y := strings.NewReplacer("retention: 720h", "retention: 1h", "mode: tokens", "mode: maybe").Replace(validYAML)
	_, err := Parse("router.yaml", []byte(y))
	if err == nil || !strings.Contains(err.Error(), "retention") || !strings.Contains(err.Error(), "auth.mode") {
		t.Fatalf("want both problems reported, got %v", err)
	}
}
