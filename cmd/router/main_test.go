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
		{[]string{"shardmap", "apply", "--pace", "gently"}, 2, `invalid value "gently" for flag -pace: "gently" is not a number`},
		{[]string{"shardmap", "apply", "--pace", "-1"}, 2, "invalid value \"-1\" for flag -pace: pace: -1 must be between 0 (no pause) and 10"},
		{[]string{"shardmap", "apply", "--pace", "0.5", "--config", "/nonexistent/router.yaml"}, 1, "no such file"},
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

// Help names every command and flag: `router help` lists dev --dir and shardmap apply, each
// command's --help prints its flags (dev --help once printed "flag: help requested" and
// nothing else), the shardmap usage lists apply, and there is a version.
func TestHelpIsComplete(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"help"}, []string{"dev [--shards N] [--listen ADDR] [--dir DIR]", "shardmap apply --config router.yaml [--dry-run]", "version"}},
		{[]string{"dev", "--help"}, []string{"-dir", "-shards", "-listen"}},
		{[]string{"serve", "-h"}, []string{"-config"}},
		{[]string{"maintain", "--help"}, []string{"-once"}},
		{[]string{"shardmap", "apply", "--help"}, []string{"-dry-run", "-config", "-pace R"}},
		{[]string{"shardmap", "help"}, []string{"router shardmap apply --config router.yaml [--dry-run]"}},
		{[]string{"version"}, []string{"router "}},
	} {
		var stdout, stderr bytes.Buffer
		if status := run(tc.args, &stdout, &stderr); status != 0 || stderr.Len() > 0 {
			t.Errorf("router %v: status %d, stderr %q; want 0 and nothing", tc.args, status, stderr.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("router %v: stdout lacks %q:\n%s", tc.args, w, stdout.String())
			}
		}
	}
}
