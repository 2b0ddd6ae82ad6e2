package shardmap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/shardgate/shardgate/internal/suggest"

	"github.com/shardgate/shardgate/internal/dsn"
)

// Problem is one thing wrong with a shard map file.
type Problem struct {
	// Line is the 1-based line the problem is on, or 0 when the YAML
	// parser reported no line or the file as a whole is at fault.
	Line int
	// Msg says what is wrong. It never contains a DSN.
	Msg string
	// Hint says what to do about it.
	Hint string
}

// ValidationError lists every problem found in a shard map file, sorted by
// line, so that an operator can fix them all in one edit.
type ValidationError struct {
	File     string
	Problems []Problem
}

// Error returns one line per problem, in the compiler-like form
// "FILE:LINE: MSG (hint: HINT)" that editors can jump to.
func (e *ValidationError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.File)
		if p.Line > 0 {
			fmt.Fprintf(&b, ":%d", p.Line)
		}
		fmt.Fprintf(&b, ": %s", p.Msg)
		if p.Hint != "" {
			fmt.Fprintf(&b, " (hint: %s)", p.Hint)
		}
	}
	return b.String()
}

// Load reads the shard map at path and parses it with [Parse], expanding
// ${VAR} from the process environment.
func Load(path string) (*Map, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("shard map: %w", err)
	}
	return Parse(path, data, os.LookupEnv)
}

// Parse validates a shard map file and returns the map it describes.
//
// Only the dsn field is expanded: each ${NAME} in it is replaced by
// lookupEnv(NAME) (a nil lookupEnv has no variables). A '$' that does not
// start "${" is literal; "${" that does not start a well-formed ${NAME} is a
// problem, as is an unset variable.
//
// Range entries are read as their source text, so an unquoted -80 (which
// YAML would call an integer) is the range "-80". Aliases are followed.
//
// On any problem Parse returns a nil *Map and a [*ValidationError] listing
// every problem at once; file is used only in its messages.
func Parse(file string, data []byte, lookupEnv func(string) (string, bool)) (*Map, error) {
	c := checker{lookupEnv: lookupEnv}
	m := c.parse(data)
	if len(c.problems) > 0 {
		sort.SliceStable(c.problems, func(i, j int) bool { return c.problems[i].Line < c.problems[j].Line })
		return nil, &ValidationError{File: file, Problems: c.problems}
	}
	return m, nil
}

// Hints shared by several problems.
const (
	rangeHint = `write ranges as Vitess hex prefixes such as "-80", "80-c0", "c0-" or "-"; ` +
		"each bound is 1 to 8 bytes (2 to 16 hex digits) and start < end"
	nameHint = "use 1-63 lower-case letters, digits and '-', starting with a letter or digit; " +
		"the name becomes a Prometheus label and a database value"
	dsnHint      = "use postgres://USER@HOST:5432/DB?sslmode=... or host=HOST dbname=DB user=USER, or ${VAR} to read it from the environment"
	versionHint  = "set version to a whole number >= 1, higher than that of the map it replaces"
	coverageHint = "every keyspace id must belong to exactly one range"
)

var (
	shardNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)
	// yamlLineRE picks the line out of yaml.v3's "yaml: line N: msg".
	yamlLineRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
)

// checker accumulates problems while walking the yaml.Node tree, so one
// pass reports everything instead of stopping at the first mistake.
type checker struct {
	lookupEnv func(string) (string, bool)
	problems  []Problem
}

func (c *checker) add(line int, msg, hint string) {
	c.problems = append(c.problems, Problem{Line: line, Msg: msg, Hint: hint})
}

// placedRange is a parsed range with its owner and source line: an entry
// of the lookup index, and what validation needs to explain an overlap.
type placedRange struct {
	r     KeyRange
	shard int // index in Map.Shards
	line  int
}

func (c *checker) parse(data []byte) *Map {
	top := c.decode(data)
	if top == nil {
		return nil
	}
	if top.Kind != yaml.MappingNode {
		c.add(top.Line, "the top level must be a mapping with the keys version and shards", "start the file with \"version: 1\" and \"shards:\"")
		return nil
	}
	fields := c.fields(top, "at the top level", "version", "shards")
	m := &Map{Version: c.version(top, fields["version"])}
	shards := fields["shards"]
	switch {
	case shards == nil:
		c.add(top.Line, "shards is missing", "add a shards: list with at least one shard")
		return nil
	case isNull(shards) || shards.Kind == yaml.SequenceNode && len(shards.Content) == 0:
		c.add(shards.Line, "shards is empty", "list at least one shard with name, dsn and ranges")
		return nil
	case shards.Kind != yaml.SequenceNode:
		c.add(shards.Line, "shards must be a list of shards", "write each shard as a \"- name: ...\" entry under shards:")
		return nil
	}
	var ranges []placedRange
	malformed := false
	firstLine := map[string]int{}
	for _, n := range shards.Content {
		n = resolve(n)
		if n.Kind != yaml.MappingNode {
			c.add(n.Line, "a shard must be a mapping with name, dsn and ranges", "write the shard as \"- name: ...\" with dsn: and ranges: indented below it")
			continue
		}
		s, rs, ok := c.shard(n, len(m.Shards), firstLine)
		m.Shards = append(m.Shards, s)
		ranges = append(ranges, rs...)
		malformed = malformed || !ok
	}
	m.index = c.coverage(m.Shards, ranges, !malformed, shards.Line)
	return m
}

// decode parses data into a node tree and returns the top-level value, or
// nil when there is nothing to walk.
func (c *checker) decode(data []byte) *yaml.Node {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			c.add(0, "the file is empty", "start the file with \"version: 1\" and \"shards:\"")
		} else {
			c.syntax(err)
		}
		return nil
	}
	// A second document would silently be ignored by a plain Unmarshal,
	// so an edit appended after a stray "---" would never take effect.
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		c.add(extra.Line, "the file holds more than one YAML document", "remove the \"---\" separator; the shard map is a single document")
	} else if !errors.Is(err, io.EOF) {
		c.syntax(err)
	}
	top := resolve(doc.Content[0])
	if isNull(top) {
		c.add(top.Line, "the file has no content", "start the file with \"version: 1\" and \"shards:\"")
		return nil
	}
	return top
}

// syntax records a YAML syntax error at the line yaml.v3 reports. yaml.v3
// omits the line for some errors and, for some parser errors, names the
// line before the mistake; the hint says so.
func (c *checker) syntax(err error) {
	line, msg := 0, strings.TrimPrefix(err.Error(), "yaml: ")
	if sm := yamlLineRE.FindStringSubmatch(err.Error()); sm != nil {
		line, _ = strconv.Atoi(sm[1]) // \d+ from yaml.v3 always fits an int
		msg = sm[2]
	}
	c.add(line, "invalid YAML: "+msg, "fix the YAML syntax at or just after this line; check indentation, quotes and brackets")
}

// resolve follows an alias to the node it names.
func resolve(n *yaml.Node) *yaml.Node {
	if n != nil && n.Kind == yaml.AliasNode {
		return n.Alias
	}
	return n
}

// isNull reports whether n is an empty value, "~" or "null".
func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// fields returns the values of mapping n by key and reports unknown,
// duplicate and non-scalar keys. Strictness catches typos such as "range:"
// that would otherwise silently drop a setting.
func (c *checker) fields(n *yaml.Node, where string, allowed ...string) map[string]*yaml.Node {
	out := make(map[string]*yaml.Node, len(allowed))
	keyLine := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		switch {
		case k.Kind != yaml.ScalarNode:
			c.add(k.Line, "a mapping key "+where+" is not a plain name", "allowed keys "+where+": "+strings.Join(allowed, ", "))
		case keyLine[k.Value] != 0:
			c.add(k.Line, fmt.Sprintf("duplicate key %q %s (first at line %d)", k.Value, where, keyLine[k.Value]), "keep one of them; YAML would silently use only one")
		default:
			keyLine[k.Value] = k.Line
			if !slices.Contains(allowed, k.Value) {
				c.add(k.Line, fmt.Sprintf("unknown key %q %s", k.Value, where), unknownKeyHint(k.Value, where, allowed))
				continue
			}
			out[k.Value] = v
		}
	}
	return out
}

// unknownKeyHint suggests the allowed key closest to a likely typo.
func unknownKeyHint(key, where string, allowed []string) string {
	hint := "allowed keys " + where + ": " + strings.Join(allowed, ", ")
	if near := suggest.Nearest(key, allowed); near != "" {
		return fmt.Sprintf("did you mean %q? %s", near, hint)
	}
	return hint
}

func (c *checker) version(top, n *yaml.Node) int64 {
	switch {
	case n == nil:
		c.add(top.Line, "version is missing", versionHint)
		return 0
	case isNull(n):
		c.add(n.Line, "version is empty", versionHint)
		return 0
	case n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int":
		c.add(n.Line, "version must be a whole number", versionHint)
		return 0
	}
	var v int64
	if err := n.Decode(&v); err != nil || v < 1 {
		c.add(n.Line, fmt.Sprintf("version %s is out of range: it must be between 1 and %d", n.Value, int64(1<<63-1)), versionHint)
		return 0
	}
	return v
}

// shard checks one shard entry. ok is false when one of its ranges could not
// be parsed, which makes a coverage gap meaningless.
func (c *checker) shard(n *yaml.Node, index int, firstLine map[string]int) (s Shard, ranges []placedRange, ok bool) {
	s.Line = n.Line
	fields := c.fields(n, "in a shard", "name", "dsn", "ranges")
	s.Name = c.shardName(n, fields["name"], firstLine)
	label := "unnamed shard"
	if s.Name != "" {
		label = fmt.Sprintf("shard %q", s.Name)
	}
	s.DSN = c.dsn(n, fields["dsn"], label)
	ok = true
	rn := fields["ranges"]
	switch {
	case rn == nil || isNull(rn):
		line := n.Line
		if rn != nil {
			line = rn.Line
		}
		c.add(line, label+" has no ranges", `add ranges: ["START-END", ...]; write ranges: [] for a shard being drained before its removal`)
		return s, nil, true
	case rn.Kind == yaml.SequenceNode && len(rn.Content) == 0:
		// An explicit empty list is a drained shard: it owns nothing, but stays in the map so that
		// `router shardmap apply` can revoke its ranges and move its rows before it is removed.
		return s, nil, true
	case rn.Kind != yaml.SequenceNode:
		c.add(rn.Line, "ranges of "+label+" must be a list", `write ranges: ["80-c0"], even for a single range`)
		return s, nil, false
	}
	for _, item := range rn.Content {
		item = resolve(item)
		if item.Kind != yaml.ScalarNode {
			c.add(item.Line, "a range of "+label+" is not a string", rangeHint)
			ok = false
			continue
		}
		r, err := ParseKeyRange(item.Value)
		if err != nil {
			c.add(item.Line, fmt.Sprintf("%s: %v", label, err), rangeHint)
			ok = false
			continue
		}
		s.Ranges = append(s.Ranges, r)
		ranges = append(ranges, placedRange{r: r, shard: index, line: item.Line})
	}
	return s, ranges, ok
}

// shardName returns the shard's name, or "" after reporting why it has
// no usable one.
func (c *checker) shardName(entry, n *yaml.Node, firstLine map[string]int) string {
	switch {
	case n == nil:
		c.add(entry.Line, "a shard has no name", nameHint)
		return ""
	case isNull(n) || n.Kind == yaml.ScalarNode && n.Value == "":
		c.add(n.Line, "a shard name is empty", nameHint)
		return ""
	case n.Kind != yaml.ScalarNode:
		c.add(n.Line, "a shard name must be a string", nameHint)
		return ""
	case !shardNameRE.MatchString(n.Value):
		c.add(n.Line, fmt.Sprintf("shard name %q is not valid", n.Value), nameHint)
	case firstLine[n.Value] != 0:
		c.add(n.Line, fmt.Sprintf("duplicate shard name %q (first at line %d)", n.Value, firstLine[n.Value]), "give every shard a unique name")
	default:
		firstLine[n.Value] = n.Line
	}
	return n.Value
}

// dsn returns the shard's DSN with ${VAR} expanded. Messages name the
// variables but never quote the DSN, which holds a password.
func (c *checker) dsn(entry, n *yaml.Node, label string) string {
	switch {
	case n == nil:
		c.add(entry.Line, label+" has no dsn", dsnHint)
		return ""
	case isNull(n) || n.Kind == yaml.ScalarNode && n.Value == "":
		c.add(n.Line, "dsn of "+label+" is empty", dsnHint)
		return ""
	case n.Kind != yaml.ScalarNode:
		c.add(n.Line, "dsn of "+label+" must be a string", dsnHint)
		return ""
	}
	conn, unset, malformed := dsn.Expand(n.Value, c.lookupEnv)
	for _, name := range unset {
		c.add(n.Line, fmt.Sprintf("dsn of %s uses ${%s}, which is not set", label, name),
			fmt.Sprintf("set %s in the router's environment, or write the value into the file", name))
	}
	if malformed {
		c.add(n.Line, "dsn of "+label+` contains a "${" that does not start a ${NAME} reference`,
			"write ${NAME} with NAME made of letters, digits and '_'; a literal \"${\" cannot appear in a dsn")
	}
	switch {
	case len(unset) > 0 || malformed:
		// The text is incomplete; judging its form would mislead.
	case conn == "":
		c.add(n.Line, "dsn of "+label+" is empty after expanding environment variables", "set the variable to the shard's connection string")
	default:
		if err := dsn.Check(conn); err != nil {
			c.add(n.Line, fmt.Sprintf("dsn of %s %v", label, err), dsnHint)
		}
	}
	return conn
}

// coverage reports overlaps, and gaps when reportGaps is set, among the
// ranges of all shards and returns them sorted by start: the lookup index.
// A sweep in start order sees a gap as a start beyond everything covered so
// far, and an overlap as a start below it. With no ranges at all (every
// shard drained), the whole keyspace is the gap, reported at line.
func (c *checker) coverage(shards []Shard, ranges []placedRange, reportGaps bool, line int) []placedRange {
	if len(ranges) == 0 {
		if reportGaps {
			c.gap(KeyRange{}, line)
		}
		return nil
	}
	sort.SliceStable(ranges, func(i, j int) bool { return ranges[i].r.start < ranges[j].r.start })
	var covered uint64 // ids below covered have an owner ...
	full := false      // ... or, when full, every id has one
	var reach placedRange
	for _, cur := range ranges {
		switch {
		case full || cur.r.start < covered:
			c.overlap(shards, reach, cur)
		case cur.r.start > covered && reportGaps:
			c.gap(KeyRange{start: covered, end: cur.r.start, bounded: true}, cur.line)
		}
		switch {
		case full:
		case !cur.r.bounded:
			full, reach = true, cur
		case cur.r.end > covered:
			covered, reach = cur.r.end, cur
		}
	}
	if !full && reportGaps {
		c.gap(KeyRange{start: covered}, reach.line)
	}
	return ranges
}

// overlap reports that b overlaps a, on the later of their lines since that
// is most likely the edit that introduced it.
func (c *checker) overlap(shards []Shard, a, b placedRange) {
	both := KeyRange{start: b.r.start, end: a.r.end, bounded: a.r.bounded}
	if b.r.bounded && (!both.bounded || b.r.end < both.end) {
		both.end, both.bounded = b.r.end, true
	}
	c.add(max(a.line, b.line),
		fmt.Sprintf("overlapping ranges: %q of shard %q (line %d) and %q of shard %q (line %d) both own keyspace %s",
			a.r.String(), shards[a.shard].Name, a.line, b.r.String(), shards[b.shard].Name, b.line, both),
		coverageHint+"; shrink or remove one of the two")
}

// gap reports an uncovered interval at line, the neighbouring range that
// could be widened to close it.
func (c *checker) gap(r KeyRange, line int) {
	c.add(line, fmt.Sprintf("keyspace %s is not covered by any shard", r),
		fmt.Sprintf("%s; add %q to a shard's ranges or widen a neighbouring range", coverageHint, r.String()))
}
