package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/shardmap"
)

// The documentation's examples are tested: README.md and docs/*.md are read as a user reads
// them, and every yaml block and every router command line in them must be accepted by the
// product itself. The conventions are described in docs/configuration.md, "Code blocks in
// these pages".

// fence is one fenced code block of a markdown file.
type fence struct {
	file string
	line int // of the first line inside the block
	info string
	body []string
}

// docFiles are the markdown files users read.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append([]string{"../../README.md"}, files...)
	if len(files) < 2 {
		t.Fatal("no documentation found under ../../docs")
	}
	return files
}

// readFences returns the fenced blocks of a markdown file.
func readFences(t *testing.T, path string) []fence {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []fence
	var cur *fence
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &fence{file: path, line: n + 1, info: strings.TrimSpace(strings.TrimLeft(trimmed, "`"))}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body = append(cur.body, line)
		}
	}
	if cur != nil {
		t.Errorf("%s:%d: code block never closed", path, cur.line-1)
	}
	return out
}

// where names a line of a block as an editor can jump to it.
func (f fence) where(i int) string {
	return fmt.Sprintf("%s:%d", strings.TrimPrefix(f.file, "../../"), f.line+i)
}

var topLevelShards = regexp.MustCompile(`(?m)^shards:`)
var topLevelAuth = regexp.MustCompile(`(?m)^auth:`)

// checkYAML decodes a yaml block with the product's own strict parser: a shard map when it has
// a top-level shards key, router.yaml otherwise. A block whose first line is "# fragment" is a
// partial router.yaml (given auth.mode none when it has no auth section), or a partial shard
// map, which is only parsed as YAML.
func checkYAML(f fence) error {
	// Blank lines in front make the parsers' line numbers the markdown file's.
	text := strings.Repeat("\n", f.line-1) + strings.Join(f.body, "\n") + "\n"
	name := strings.TrimPrefix(f.file, "../../")
	fragment := len(f.body) > 0 && strings.TrimSpace(f.body[0]) == "# fragment"
	isMap := topLevelShards.MatchString(text)
	switch {
	case isMap && fragment:
		var v any
		return yaml.Unmarshal([]byte(text), &v)
	case isMap:
		_, err := shardmap.Parse(name, []byte(text), func(string) (string, bool) {
			return "postgres://ledger@127.0.0.1:5432/ledger", true
		})
		return err
	case fragment && !topLevelAuth.MatchString(text):
		text += "auth:\n  mode: none\n"
	}
	_, err := config.Parse(name, []byte(text))
	return err
}

func TestDocsYAMLBlocks(t *testing.T) {
	blocks := 0
	for _, path := range docFiles(t) {
		for _, f := range readFences(t, path) {
			if f.info != "yaml" {
				continue
			}
			blocks++
			if err := checkYAML(f); err != nil {
				t.Errorf("%s: yaml block does not decode:\n%v", f.where(-1), err)
			}
		}
	}
	if blocks == 0 {
		t.Error("no yaml blocks found: the documentation's examples went untested")
	}
}

// commandLines returns the shell lines of an sh or console block, continuations joined, each
// with the index of its first line. In a console block only lines after a "$ " prompt count.
func commandLines(f fence) (lines []string, at []int) {
	console := f.info == "console"
	for i := 0; i < len(f.body); i++ {
		line, start := f.body[i], i
		if console {
			if !strings.HasPrefix(line, "$ ") {
				continue
			}
			line = line[2:]
		}
		for strings.HasSuffix(line, `\`) && i+1 < len(f.body) {
			i++
			line = strings.TrimSuffix(line, `\`) + " " + strings.TrimSpace(f.body[i])
		}
		lines, at = append(lines, line), append(at, start)
	}
	return lines, at
}

// shellWords splits a command line into words as a shell would for simple commands: quotes
// removed, a comment dropped, and ;, && and | ending a command. It returns the commands.
func shellWords(line string) [][]string {
	var cmds [][]string
	var words []string
	var w strings.Builder
	inWord := false
	var quote rune
	flush := func() {
		if inWord {
			words = append(words, w.String())
		}
		w.Reset()
		inWord = false
	}
	end := func() {
		flush()
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
		words = nil
	}
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			w.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == '#' && !inWord:
			end()
			return cmds
		case r == ' ' || r == '\t':
			flush()
		case r == ';' || r == '&' || r == '|':
			end()
		default:
			w.WriteRune(r)
			inWord = true
		}
	}
	end()
	return cmds
}

// routerArgs returns the arguments of a router invocation (router, ./bin/router or
// bin/router, after any VAR=value assignments), or false for any other command.
func routerArgs(words []string) ([]string, bool) {
	for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
		words = words[1:]
	}
	if len(words) == 0 {
		return nil, false
	}
	switch words[0] {
	case "router", "./bin/router", "bin/router":
		return words[1:], true
	}
	return nil, false
}

// readOnly are the commands that only read the files they are given: the test may run them
// without -h to check their arguments.
func readOnly(args []string) bool {
	if len(args) > 0 && (args[0] == "version" || args[0] == "help") {
		return true
	}
	return len(args) > 1 && args[0] == "shardmap" && (args[1] == "check" || args[1] == "route" || args[1] == "diff")
}

// checkCommand parses a documented router command line with the real command's flag set,
// without running it: -h after the flags makes a command print its flags and stop, and a
// mistake in them is a usage error (exit status 2). Commands without flags that only read
// files are run as written; they must not end in a usage error.
func checkCommand(args []string) error {
	var stdout, stderr bytes.Buffer
	if run(append(append([]string{}, args...), "-h"), &stdout, &stderr) == 0 {
		return nil
	}
	if !readOnly(args) {
		return fmt.Errorf("router %s: %s", strings.Join(args, " "), strings.TrimSpace(stderr.String()))
	}
	stdout.Reset()
	stderr.Reset()
	if run(args, &stdout, &stderr) == 2 {
		return fmt.Errorf("router %s: %s", strings.Join(args, " "), strings.TrimSpace(stderr.String()))
	}
	return nil
}

func TestDocsRouterCommands(t *testing.T) {
	commands := 0
	for _, path := range docFiles(t) {
		for _, f := range readFences(t, path) {
			if f.info != "sh" && f.info != "console" {
				continue
			}
			lines, at := commandLines(f)
			for i, line := range lines {
				for _, words := range shellWords(line) {
					args, ok := routerArgs(words)
					if !ok {
						continue
					}
					commands++
					if err := checkCommand(args); err != nil {
						t.Errorf("%s: %v", f.where(at[i]), err)
					}
				}
			}
		}
	}
	if commands == 0 {
		t.Error("no router command lines found: the documentation's commands went untested")
	}
}

// TestDocsCheckersCatchMistakes makes sure the checks above can fail.
func TestDocsCheckersCatchMistakes(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--conf", "router.yaml"},
		{"dev", "--shard", "3"},
		{"shardmap", "apply", "--config", "router.yaml", "--dryrun"},
		{"shardmap", "route", "shardmap.yaml"},
		{"reconcile", "--since", "soon"},
		{"frobnicate"},
	} {
		if checkCommand(args) == nil {
			t.Errorf("router %s was accepted", strings.Join(args, " "))
		}
	}
	for _, args := range [][]string{
		{"serve", "--config", "router.yaml"},
		{"maintain", "--config", "router.yaml", "--once"},
		{"shardmap", "check", "does-not-exist.yaml"},
	} {
		if err := checkCommand(args); err != nil {
			t.Errorf("a correct command was refused: %v", err)
		}
	}
	bad := []fence{
		{file: "x.md", line: 1, info: "yaml", body: []string{"group_commit:", "  in_fligth: 2"}},
		{file: "x.md", line: 1, info: "yaml", body: []string{"# fragment", "relay:", "  batch: many"}},
		{file: "x.md", line: 1, info: "yaml", body: []string{"version: 1", "shards:", "  - name: a", "    dsn: x", `    ranges: ["-80"]`}},
	}
	for _, f := range bad {
		if checkYAML(f) == nil {
			t.Errorf("yaml block %q was accepted", f.body)
		}
	}
	wrong := fence{file: "x.md", line: 10, info: "yaml", body: []string{"group_commit:", "  in_fligth: 2"}}
	if err := checkYAML(wrong); err == nil || !strings.Contains(err.Error(), "line 11:") {
		t.Errorf("the error should name the markdown file's line 11: %v", err)
	}
	good := fence{file: "x.md", line: 1, info: "yaml", body: []string{"# fragment", "group_commit: {in_flight: 2}"}}
	if err := checkYAML(good); err != nil {
		t.Errorf("a correct fragment was refused: %v", err)
	}
	if got := shellWords(`FOO=1 ./bin/router dev --dir "./my sandbox" && curl -s x # note`); len(got) != 2 || got[0][4] != "./my sandbox" {
		t.Errorf("shellWords split the line wrongly: %q", got)
	}
}
