package config

import (
	"strings"
	"testing"
	"time"
)

// Buffering is on by default, with its bounds; either bound at 0 turns it off.
func TestBufferingDefaultsAndOff(t *testing.T) {
	c, err := Parse("router.yaml", []byte(validYAML))
	if err != nil {
		t.Fatal(err)
	}
	if c.Buffering.MaxWait != 3*time.Second || c.Buffering.MaxRequests != 1000 || !c.Buffering.Enabled() {
		t.Errorf("default buffering %+v (enabled %t), want 3s, 1000, on", c.Buffering, c.Buffering.Enabled())
	}
	for _, off := range []string{"buffering:\n  max_wait: 0s\n", "buffering:\n  max_requests: 0\n"} {
		c, err := Parse("router.yaml", []byte(validYAML+off))
		if err != nil {
			t.Fatalf("%q: %v", off, err)
		}
		if c.Buffering.Enabled() {
			t.Errorf("%q leaves buffering on: %+v", off, c.Buffering)
		}
	}
}

func TestBufferingRejects(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"wait as long as the request", "buffering:\n  max_wait: 5s\n", "buffering.max_wait: 5s must be between 0 (off) and below shard_pool.request_timeout (5s)"},
		{"negative wait", "buffering:\n  max_wait: -1s\n", "buffering.max_wait: -1s must be"},
		{"negative count", "buffering:\n  max_requests: -1\n", "buffering.max_requests: -1 must be between 0 (off) and 100000"},
		{"too many", "buffering:\n  max_requests: 100001\n", "buffering.max_requests: 100001 must be"},
		{"unknown key", "buffering:\n  window: 1s\n", "buffering.window is not a setting (buffering takes max_requests, max_wait)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("router.yaml", []byte(validYAML+tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
	// A short request timeout shortens the default wait, and stays valid.
	c, err := Parse("router.yaml", []byte(validYAML+"shard_pool:\n  request_timeout: 2s\n"))
	if err != nil || c.Buffering.MaxWait != time.Second {
		t.Errorf("request_timeout 2s: %v, max_wait %v, want 1s", err, c.Buffering.MaxWait)
	}
	// A longer request timeout makes room for a longer wait.
	if _, err := Parse("router.yaml", []byte(validYAML+"shard_pool:\n  request_timeout: 20s\nrelay:\n  lease: 1m\nbuffering:\n  max_wait: 10s\n")); err != nil {
		t.Errorf("max_wait 10s under request_timeout 20s: %v", err)
	}
}
