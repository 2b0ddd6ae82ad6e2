package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Without a router.yaml, serve says which flag names one and that router dev needs none; a
// router.yaml whose shard map is missing is not mistaken for it.
func TestMissingConfigHint(t *testing.T) {
	t.Chdir(t.TempDir())
	var stdout, stderr bytes.Buffer
	if status := run([]string{"serve"}, &stdout, &stderr); status != 1 {
		t.Errorf("router serve: status %d, want 1", status)
	}
	for _, want := range []string{"router.yaml: no such file", "--config FILE", "router dev"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("router serve without router.yaml: %q lacks %q", stderr.String(), want)
		}
	}
	os.WriteFile("router.yaml", []byte("listen: 127.0.0.1:0\nshardmap: gone.yaml\nauth: {mode: none}\n"), 0o600)
	stderr.Reset()
	run([]string{"migrate"}, &stdout, &stderr)
	if !strings.Contains(stderr.String(), "gone.yaml") || strings.Contains(stderr.String(), "router dev") {
		t.Errorf("router migrate with a missing shard map: %q, want the map's name and no --config advice", stderr.String())
	}
}

// With a shard down, migrate and shardmap apply (--dry-run too) name the shard, its DSN with
// the password redacted and what to check, and change nothing.
func TestShardDownHint(t *testing.T) {
	dir := t.TempDir()
	const password = "s3cret-pw-9"
	mapYAML := "version: 1\nshards:\n  - name: shard-a\n    dsn: postgres://u:" + password + "@127.0.0.1:1/db?sslmode=disable\n    ranges: [\"-\"]\n"
	cfgPath := filepath.Join(dir, "router.yaml")
	os.WriteFile(filepath.Join(dir, "shardmap.yaml"), []byte(mapYAML), 0o600)
	os.WriteFile(cfgPath, []byte("listen: 127.0.0.1:0\nshardmap: shardmap.yaml\nauth: {mode: none}\n"), 0o600)
	for _, args := range [][]string{
		{"migrate", "--config", cfgPath},
		{"shardmap", "apply", "--dry-run", "--config", cfgPath},
		{"shardmap", "apply", "--config", cfgPath},
	} {
		var stdout, stderr bytes.Buffer
		if status := run(args, &stdout, &stderr); status != 1 {
			t.Errorf("router %v: status %d, want 1", args, status)
		}
		msg := stderr.String()
		for _, want := range []string{"shard shard-a (postgres://u:xxxxx@127.0.0.1:1/db?sslmode=disable) cannot be reached", "is running and listening at that host and port", "nothing was changed"} {
			if !strings.Contains(msg, want) {
				t.Errorf("router %v: %q lacks %q", args, msg, want)
			}
		}
		if strings.Contains(msg+stdout.String(), password) {
			t.Errorf("router %v: the password is in the output: %q", args, msg)
		}
	}
}
