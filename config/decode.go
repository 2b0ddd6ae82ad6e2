package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// decode reads router.yaml strictly, in words an operator can act on. The file is walked as a
// node tree against the Go types it decodes into, and every problem in it is reported at once,
// by line and by the key's path: an unknown key with the keys its section takes
// and the nearest of them (group_commit.in_fligth is not a setting; did you mean in_flight?
// (group_commit takes in_flight, max_batch, …)), a
// value of the wrong kind with the kind its key takes (group_commit.max_batch: "many" is not a
// whole number), never a Go type.
func decode(data []byte) (*file, error) {
	// The decoder first, strict: it refuses what no walk should go through (a syntax error,
	// excessive aliasing); its type errors name Go types, so the walk words them, and the walk
	// also refuses a fraction for a whole number, which the decoder would cut.
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(&f)
	if errors.Is(err, io.EOF) {
		return &f, nil
	}
	var typeErr *yaml.TypeError
	if err != nil && !errors.As(err, &typeErr) {
		return nil, err
	}
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		if err != nil {
			return nil, err
		}
		return &f, nil
	}
	var w walker
	w.walk(doc.Content[0], reflect.TypeOf(file{}), "", "")
	if len(w.problems) == 0 {
		if err != nil {
			return nil, err // the walk judges as the decoder does; should they differ, the decoder's words
		}
		return &f, nil
	}
	sort.SliceStable(w.problems, func(i, j int) bool { return w.problems[i].line < w.problems[j].line })
	msgs := make([]string, len(w.problems))
	for i, p := range w.problems {
		msgs[i] = fmt.Sprintf("line %d: %s", p.line, p.msg)
	}
	return nil, fmt.Errorf("invalid configuration:\n  %s", strings.Join(msgs, "\n  "))
}

type problem struct {
	line int
	msg  string
}

// walker collects the problems of a router.yaml node tree.
type walker struct {
	problems []problem
	depth    int // merge keys followed, to stop at an anchor that merges itself
}

func (w *walker) add(line int, format string, args ...any) {
	w.problems = append(w.problems, problem{line, fmt.Sprintf(format, args...)})
}

var unmarshaler = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()

// walk checks n, the value of the key at path, against t, the Go type it decodes into. via is
// empty, or says where a merge key brought n in.
func (w *walker) walk(n *yaml.Node, t reflect.Type, path, via string) {
	line := n.Line // an alias is reported where it is used
	if n.Kind == yaml.AliasNode {
		if n.Alias == nil {
			return
		}
		n = n.Alias
	}
	if n.ShortTag() == "!!null" {
		return // absent: the default applies
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	name := orFile(path)
	switch {
	case reflect.PointerTo(t).Implements(unmarshaler):
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			msg := err.Error()
			if te := (*yaml.TypeError)(nil); errors.As(err, &te) {
				msg = strings.Join(te.Errors, "; ")
			}
			w.add(line, "%s: %s%s", name, msg, via) // its own words: "…" is not a duration
		}
	case t.Kind() == reflect.Struct:
		if n.Kind != yaml.MappingNode {
			w.add(line, "%s: %s is not a mapping of settings%s", name, describe(n), via)
			return
		}
		w.mapping(n, t, path, via)
	case t.Kind() == reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.add(line, "%s: %s is not a list%s", name, describe(n), via)
			return
		}
		for i, item := range n.Content {
			w.walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), via)
		}
	default:
		w.leaf(n, t, line, name, via)
	}
}

// mapping checks the keys of n, a mapping for the struct type t, and their values.
func (w *walker) mapping(n *yaml.Node, t reflect.Type, path, via string) {
	fields := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		fields[name] = t.Field(i).Type
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		var key string
		if err := k.Decode(&key); err != nil {
			w.add(k.Line, "%s: a key that is not text%s", orFile(path), via)
			continue
		}
		if key == "<<" && k.ShortTag() == "!!merge" {
			w.merge(v, t, path, fmt.Sprintf(", merged in at line %d", k.Line))
			continue
		}
		at := join(path, quoteKey(key))
		ft, ok := fields[key]
		if !ok {
			w.add(k.Line, "%s is not a setting%s (%s)%s", at, didYouMean(key, fields), takes(path, fields), via)
			continue
		}
		w.walk(v, ft, at, via)
	}
}

// merge checks what a merge key brings into the mapping at path: a mapping, or a list of them.
func (w *walker) merge(v *yaml.Node, t reflect.Type, path, via string) {
	if w.depth > 16 {
		return // an anchor merged into itself: the decoder refuses it
	}
	w.depth++
	defer func() { w.depth-- }()
	line := v.Line
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	switch v.Kind {
	case yaml.MappingNode:
		w.mapping(v, t, path, via)
	case yaml.SequenceNode:
		for _, m := range v.Content {
			w.merge(m, t, path, via)
		}
	default:
		w.add(line, "%s: a merge key (<<) takes a mapping or a list of them, not %s", orFile(path), describe(v))
	}
}

// leaf decodes the scalar n into a value of type t, as the decoder will, and words why not.
func (w *walker) leaf(n *yaml.Node, t reflect.Type, line int, name, via string) {
	if n.Kind != yaml.ScalarNode {
		w.add(line, "%s: %s is not %s%s", name, describe(n), kindOf(t), via)
		return
	}
	isInt := isInteger(t)
	err := n.Decode(reflect.New(t).Interface())
	switch {
	case err == nil && (!isInt || n.ShortTag() == "!!int"):
		return
	case isInt && n.ShortTag() == "!!int":
		w.add(line, "%s: %s is out of range (%s)%s", name, describe(n), intRange(t), via)
	default:
		w.add(line, "%s: %s is not %s%s", name, describe(n), kindOf(t), via)
	}
}

func orFile(path string) string {
	if path == "" {
		return "router.yaml"
	}
	return path
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var plainKey = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// quoteKey prints a key as it is when it looks like one, and quoted (escapes and all) when not,
// so that a key holding a newline cannot forge a line of the error.
func quoteKey(key string) string {
	if plainKey.MatchString(key) {
		return key
	}
	return strconv.Quote(truncate(key))
}

// describe words a value for an error: a scalar quoted (at most 40 characters), else its kind.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(truncate(n.Value))
}

func truncate(s string) string {
	if r := []rune(s); len(r) > 40 {
		return string(r[:40]) + "…"
	}
	return s
}

// takes words the keys a section accepts, for an unknown key's error.
func takes(path string, fields map[string]reflect.Type) string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	return orFile(path) + " takes " + strings.Join(names, ", ")
}

// kindOf words a Go type as the kind of value a key takes.
func kindOf(t reflect.Type) string {
	if isInteger(t) {
		return "a whole number"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "text"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		return "a list"
	}
	return "a mapping of settings"
}

func isInteger(t reflect.Type) bool { return t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64 }

// intRange words the values an integer type holds.
func intRange(t reflect.Type) string {
	bits := t.Bits()
	if t.Kind() >= reflect.Uint {
		return fmt.Sprintf("0 to %d", uint64(1)<<bits-1)
	}
	return fmt.Sprintf("%d to %d", int64(-1)<<(bits-1), int64(1)<<(bits-1)-1)
}
