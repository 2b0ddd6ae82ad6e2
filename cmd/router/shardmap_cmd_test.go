package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	mapV7 = `version: 7
shards:
  - name: shard-a
    dsn: postgres://ledger@10.0.0.11:5432/ledger?sslmode=disable
    ranges: ["-80"]
  - name: shard-b
    dsn: postgres://ledger:hunter2@10.0.0.12:5432/ledger
    ranges: ["80-c0", "c0-"]
`
	mapV8 = `version: 8
shards:
  - name: shard-a
    dsn: postgres://ledger@10.0.0.11:5432/ledger?sslmode=disable
    ranges: ["-80"]
  - name: shard-b
    dsn: postgres://ledger:hunter3@10.0.0.12:5432/ledger
    ranges: ["c0-"]
  - name: shard-c
    dsn: host=10.0.0.13 dbname=ledger
    ranges: ["80-c0"]
`
	mapInvalid = `version: 7
shards:
  - name: shard-a
    dsn: ${SHARDMAP_CMD_TEST_UNSET}
    ranges: ["-80"]
`
)

func TestRunShardmap(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{"v7.yaml": mapV7, "v8.yaml": mapV8, "bad.yaml": mapInvalid}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := func(name string) string { return filepath.Join(dir, name) }

	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string // the exact stdout, when set
		wantOut    []string
		wantErr    []string
		noStdout   bool
		emptyError bool
	}{
		{name: "no subcommand", args: nil, code: 2, noStdout: true, wantErr: []string{"missing subcommand", "usage:"}},
		{name: "unknown subcommand", args: []string{"lint", p("v7.yaml")}, code: 2, noStdout: true, wantErr: []string{`unknown subcommand "lint"`}},
		{name: "help", args: []string{"help"}, code: 0, wantOut: []string{"router shardmap check FILE"}, emptyError: true},
		{name: "check without file", args: []string{"check"}, code: 2, noStdout: true, wantErr: []string{"check takes 1 arguments, got 0"}},
		{name: "check with extra argument", args: []string{"check", p("v7.yaml"), p("v8.yaml")}, code: 2, noStdout: true, wantErr: []string{"got 2"}},
		{name: "check valid", args: []string{"check", p("v8.yaml")}, code: 0, stdout: "ok: version 8, 3 shards, keyspace fully covered\n", emptyError: true},
		{name: "check invalid", args: []string{"check", p("bad.yaml")}, code: 1, noStdout: true, wantErr: []string{
			p("bad.yaml") + ":4: dsn of shard \"shard-a\" uses ${SHARDMAP_CMD_TEST_UNSET}, which is not set",
			p("bad.yaml") + ":5: keyspace 80- is not covered by any shard",
			"is invalid: 2 problem(s)",
		}},
		{name: "check missing file", args: []string{"check", p("nope.yaml")}, code: 1, noStdout: true, wantErr: []string{"router shardmap check: shard map: open", "no such file"}},
		{name: "route", args: []string{"route", p("v7.yaml"), "8842"}, code: 0, stdout: "account 8842 keyspace_id 1d65d16c18855fc7 range -80 shard shard-a\n", emptyError: true},
		{name: "route negative account", args: []string{"route", p("v7.yaml"), "-5"}, code: 0, stdout: "account -5 keyspace_id b46b527273306370 range 80-c0 shard shard-b\n", emptyError: true},
		{name: "route bad account", args: []string{"route", p("v7.yaml"), "88x"}, code: 2, noStdout: true, wantErr: []string{`ACCOUNT must be a decimal 64-bit integer, got "88x"`}},
		{name: "route account out of range", args: []string{"route", p("v7.yaml"), "9223372036854775808"}, code: 2, noStdout: true, wantErr: []string{"ACCOUNT must be"}},
		{name: "route invalid map", args: []string{"route", p("bad.yaml"), "1"}, code: 1, noStdout: true, wantErr: []string{"is invalid"}},
		{name: "route without account", args: []string{"route", p("v7.yaml")}, code: 2, noStdout: true, wantErr: []string{"route takes 2 arguments, got 1"}},
		{name: "diff forward", args: []string{"diff", p("v7.yaml"), p("v8.yaml")}, code: 0, wantOut: []string{
			"shards added: shard-c\n",
			"dsn changed (not shown): shard-b\n",
			"verdict: 25.00% of the keyspace changes owner (80-c0: shard-b -> shard-c); version 7 -> 8\n",
		}, emptyError: true},
		{name: "diff backwards", args: []string{"diff", p("v8.yaml"), p("v7.yaml")}, code: 1, wantOut: []string{
			"problem: version does not increase (8 -> 7)",
		}, wantErr: []string{"version of " + p("v7.yaml") + " (7) does not increase over " + p("v8.yaml") + " (8)"}},
		{name: "diff same file", args: []string{"diff", p("v7.yaml"), p("v7.yaml")}, code: 1, wantOut: []string{"verdict: no ownership change; problem: version does not increase (7 -> 7)"}},
		{name: "diff with invalid maps", args: []string{"diff", p("bad.yaml"), p("nope.yaml")}, code: 1, noStdout: true, wantErr: []string{"bad.yaml:4:", "nope.yaml"}},
		{name: "diff one argument", args: []string{"diff", p("v7.yaml")}, code: 2, noStdout: true, wantErr: []string{"diff takes 2 arguments, got 1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runShardmap(context.Background(), tt.args, &stdout, &stderr)
			if code != tt.code {
				t.Errorf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, &stdout, &stderr)
			}
			out, errOut := stdout.String(), stderr.String()
			if tt.stdout != "" && out != tt.stdout {
				t.Errorf("stdout = %q, want %q", out, tt.stdout)
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(out, w) {
					t.Errorf("stdout lacks %q:\n%s", w, out)
				}
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
			if tt.noStdout && out != "" {
				t.Errorf("stdout should be empty, got:\n%s", out)
			}
			if tt.emptyError && errOut != "" {
				t.Errorf("stderr should be empty, got:\n%s", errOut)
			}
			if strings.Contains(out+errOut, "hunter") {
				t.Errorf("output leaks a password:\n%s%s", out, errOut)
			}
		})
	}
}
