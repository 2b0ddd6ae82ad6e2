package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// mdLink is an inline markdown link: [text](target). Images and autolinks are not links to pages.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// mdHeading is an ATX heading outside code blocks.
var mdHeading = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)

// slug is the anchor GitHub gives a heading: lower case, punctuation other than '-' and '_'
// dropped, spaces turned into '-'.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_':
			b.WriteRune(r)
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the heading anchors of a markdown file (a repeated heading gets -1, -2, ...).
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	seen := map[string]int{}
	inCode := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		m := mdHeading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(strings.ReplaceAll(m[1], "`", ""))
		if n := seen[s]; n > 0 {
			out[s+"-"+strconv.Itoa(n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// brokenLinks returns, for one markdown file, each relative link whose file or heading does not
// exist, as "file:line: target".
func brokenLinks(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	inCode := false
	for i, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := path
			if file != "" {
				dest = filepath.Join(filepath.Dir(path), file)
				if _, err := os.Stat(dest); err != nil {
					bad = append(bad, where(path, i)+": "+target+": no such file")
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[anchor] {
				bad = append(bad, where(path, i)+": "+target+": no such heading")
			}
		}
	}
	return bad
}

func where(path string, i int) string {
	return strings.TrimPrefix(path, "../../") + ":" + strconv.Itoa(i+1)
}

// TestDocsLinks: every relative link in README.md and docs/ reaches a file that exists, and a
// heading that exists when it names one.
func TestDocsLinks(t *testing.T) {
	for _, f := range docFiles(t) {
		for _, b := range brokenLinks(t, f) {
			t.Error(b)
		}
	}
}

// TestDocsLinksCatchesBrokenOnes: the checker reports a missing file and a missing heading.
func TestDocsLinksCatchesBrokenOnes(t *testing.T) {
	dir := t.TempDir()
	page := filepath.Join(dir, "a.md")
	text := "# Top part\n\n## Seeing a `409`\n\n[ok](#seeing-a-409) [ok2](a.md#top-part)\n" +
		"[gone](missing.md) [nohead](a.md#nowhere)\n```\n[in code](missing2.md)\n```\n"
	if err := os.WriteFile(page, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := brokenLinks(t, page)
	if len(bad) != 2 || !strings.Contains(bad[0], "missing.md: no such file") || !strings.Contains(bad[1], "a.md#nowhere: no such heading") {
		t.Fatalf("brokenLinks = %q, want the missing file and the missing heading", bad)
	}
}
