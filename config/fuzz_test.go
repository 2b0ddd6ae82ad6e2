package config

import (
	"strings"
	"testing"
)

// FuzzParse: no router.yaml makes Parse panic, and whatever the strict decoder refuses for a
// key or a value, the walk words itself: no yaml.v3 type error, with its Go types, reaches the
// operator.
func FuzzParse(f *testing.F) {
	f.Add([]byte(validYAML))
	for _, s := range []string{
		"colour: blue\ngroup_commit:\n  max_batch: many\n",
		"relay: {batch: y, enabled: z}\n",
		"relay: &r\n  enabled: true\ngroup_commit:\n  <<: *r\n",
		"auth:\n  mode: tokens\n  clients: &c [{name: a, token_sha256: x}, *c]\n",
		"shard_pool:\n  max_conns: 3000000000\nhttp:\n  max_header_bytes: 0x10\n",
		"group_commit:\n  <<: [{max_batch: 8}, {stall_after: 1s}]\n  max_batch: 2\n",
		"idempotency: {retention: 720h, replay_window: [1]}\ntls: ~\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := Parse("router.yaml", data)
		if err == nil {
			return
		}
		if msg := err.Error(); strings.Contains(msg, "cannot unmarshal") || strings.Contains(msg, "not found in type") {
			t.Fatalf("a decoder error the walk did not word: %v", err)
		}
	})
}
