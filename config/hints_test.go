package config

import (
	"strings"
	"testing"
)

// A mistyped key gets the nearest key its section takes; a key near none gets the list alone.
func TestUnknownKeyDidYouMean(t *testing.T) {
	for _, tc := range []struct{ yml, want string }{
		{"group_commit:\n  in_fligth: 2\n", "group_commit.in_fligth is not a setting; did you mean in_flight? (group_commit takes"},
		{"replay-cache: {}\n", "replay-cache is not a setting; did you mean replay_cache? (router.yaml takes"},
		{"Listen: 127.0.0.1:1\n", "Listen is not a setting; did you mean listen? (router.yaml takes"},
		{"colour: blue\n", "colour is not a setting (router.yaml takes"},
	} {
		_, err := Parse("router.yaml", []byte(tc.yml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v\nwant %q", tc.yml, err, tc.want)
		}
	}
}

// mode tokens without clients says how to make one, and how to try without.
func TestNoClientsHint(t *testing.T) {
	_, err := Parse("router.yaml", []byte("listen: 127.0.0.1:8080\nshardmap: shardmap.yaml\n"))
	for _, want := range []string{"auth.clients: mode tokens needs at least one client", "router token new --name NAME", "auth.mode: none"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("no clients: %v\nwant %q", err, want)
		}
	}
	_, err = Parse("router.yaml", []byte("listen: 127.0.0.1:8080\nshardmap: shardmap.yaml\nauth:\n  clients: [{name: a, token_sha256: abc}]\n"))
	if err == nil || !strings.Contains(err.Error(), "router token new --name NAME") {
		t.Errorf("bad hash: %v, want it to point to router token new", err)
	}
}
