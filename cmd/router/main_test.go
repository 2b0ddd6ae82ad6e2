package main

import (
	"bytes"
	"strings"
	"testing"
)

// Every failure is one line on stderr and a non-zero status: 2 for how the command was called,
// 1 for what it found.
func TestRunExitStatus(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		status int
		stderr string
	}{
		{nil, 2, "usage: router <command>"},
		{[]string{"bogus"}, 2, `unknown command "bogus"`},
		{[]string{"serve", "--nope"}, 2, "flag provided but not defined: -nope"},
		{[]string{"serve", "--config", "/nonexistent/router.yaml"}, 1, "no such file"},
		{[]string{"migrate", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"dev", "--shards", "0"}, 2, "--shards must be between 1 and 16"},
		{[]string{"help"}, 0, ""},
	} {
		var stdout, stderr bytes.Buffer
		status := run(tc.args, &stdout, &stderr)
		if status != tc.status || !strings.Contains(stderr.String(), tc.stderr) {
			t.Errorf("router %v: status %d, stderr %q; want %d and %q", tc.args, status, stderr.String(), tc.status, tc.stderr)
		}
		if tc.status != 0 && len(tc.args) > 0 && strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("router %v: stderr is not one line: %q", tc.args, stderr.String())
		}
	}
}
