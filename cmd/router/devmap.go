package main

import (
	"bytes"
	"encoding/json"
	"strings"

	"gopkg.in/yaml.v3"
)

// rewriteDSNs returns the kept sandbox's map data with each shard's dsn value replaced by
// dsns[i] in place: indentation, comments, quoting and order stay as the user wrote them. ok
// is false when a value is not a one-line scalar that can be replaced by its position (a
// multi-line or aliased dsn); the caller then writes the parsed map out whole.
func rewriteDSNs(data []byte, doc *yaml.Node, dsns []string) (out []byte, ok bool) {
	lines := bytes.SplitAfter(data, []byte("\n"))
	// Replaced from the last to the first, so that an edit never moves a position still to come
	// (two values on one line, in a flow mapping, stay right).
	type edit struct{ line, col, end int }
	var edits []edit
	var values []string
	for i, shard := range shardNodes(doc) {
		v := mappingValue(shard, "dsn")
		if v == nil || i >= len(dsns) {
			continue
		}
		if v.Kind != yaml.ScalarNode || v.Line < 1 || v.Line > len(lines) {
			return nil, false
		}
		line := string(lines[v.Line-1])
		start := byteColumn(line, v.Column)
		n := scalarLen(line[start:], v)
		if n < 0 {
			return nil, false
		}
		edits = append(edits, edit{v.Line - 1, start, start + n})
		values = append(values, scalarText(dsns[i], v.Style, inFlow(line[:start])))
	}
	for k := len(edits) - 1; k >= 0; k-- {
		e := edits[k]
		l := lines[e.line]
		lines[e.line] = append(append(append([]byte{}, l[:e.col]...), values[k]...), l[e.end:]...)
	}
	return bytes.Join(lines, nil), true
}

// byteColumn turns yaml's 1-based column (in characters) into a byte offset in line.
func byteColumn(line string, col int) int {
	n := 0
	for i := range line {
		if n == col-1 {
			return i
		}
		n++
	}
	return len(line)
}

// scalarLen is the length in bytes of the source text of the one-line scalar v at the start of
// s, or -1 when that text is not v on one line.
func scalarLen(s string, v *yaml.Node) int {
	switch {
	case v.Style&yaml.DoubleQuotedStyle != 0:
		for i := 1; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			case '\n':
				return -1
			}
		}
	case v.Style&yaml.SingleQuotedStyle != 0:
		for i := 1; i < len(s); i++ {
			switch s[i] {
			case '\'':
				if i+1 < len(s) && s[i+1] == '\'' {
					i++
					continue
				}
				return i + 1
			case '\n':
				return -1
			}
		}
	case v.Style == 0 && strings.HasPrefix(s, v.Value) && v.Value != "":
		return len(v.Value)
	}
	return -1
}

// inFlow reports whether the text before a value leaves it inside a flow collection ({ or [).
func inFlow(before string) bool {
	return strings.ContainsAny(before, "{[")
}

// scalarText writes dsn as the value was written: single- or double-quoted as it was, plain
// where plain YAML keeps it as it is, double-quoted otherwise.
func scalarText(dsn string, style yaml.Style, flow bool) string {
	switch {
	case style&yaml.SingleQuotedStyle != 0:
		return "'" + strings.ReplaceAll(dsn, "'", "''") + "'"
	case style&yaml.DoubleQuotedStyle == 0 && plainSafe(dsn, flow):
		return dsn
	}
	q, _ := json.Marshal(dsn) // a JSON string is a YAML double-quoted scalar
	return string(q)
}

// plainSafe reports whether dsn reads back as itself when written as a plain scalar.
func plainSafe(dsn string, flow bool) bool {
	if dsn == "" || strings.ContainsAny(dsn[:1], "!&*-?:,[]{}#|>@`\"'%") || strings.Contains(dsn, " #") ||
		strings.Contains(dsn, ": ") || strings.ContainsAny(dsn, "\n\t") || strings.HasSuffix(dsn, ":") || strings.TrimSpace(dsn) != dsn {
		return false
	}
	if flow && strings.ContainsAny(dsn, ",[]{}") {
		return false
	}
	var back string
	return yaml.Unmarshal([]byte("v: "+dsn), &struct{ V *string }{&back}) == nil && back == dsn
}
