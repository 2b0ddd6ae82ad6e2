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

// decode reads router.yaml strictly, in words an operator can act on: an unknown key is an
// error naming the key by its path (group_commit.in_fligth), its line and the keys its section
// takes; a value of the wrong kind names its key and the kind it should be, not a Go type.
// Every such problem in the file is reported at once.
func decode(data []byte) (*file, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	keys := map[int]string{} // line -> the path of the key whose value starts there
	var problems []string
	if len(doc.Content) > 0 {
		walkKeys(doc.Content[0], reflect.TypeOf(file{}), "", keys, &problems)
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("invalid configuration:\n  %s", strings.Join(problems, "\n  "))
	}
	// The decoder stays strict as well: it catches what the walk above reads leniently
	// (aliases, merge keys) and reports values of the wrong kind.
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, err
		}
		for _, e := range te.Errors {
			problems = append(problems, wrongKind(e, keys))
		}
		return nil, fmt.Errorf("invalid configuration:\n  %s", strings.Join(problems, "\n  "))
	}
	return &f, nil
}

var unmarshaler = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()

// walkKeys checks the mapping keys under n against t, the Go type n decodes into, recording
// in keys the path of each key by its value's line and in problems each key t has no field for.
func walkKeys(n *yaml.Node, t reflect.Type, path string, keys map[int]string, problems *[]string) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshaler) {
		return // a value with its own decoding (a duration): a leaf
	}
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			fields[name] = t.Field(i).Type
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" {
				continue // a merge key: the strict decoder judges what it brings
			}
			at := join(path, k.Value)
			ft, ok := fields[k.Value]
			if !ok {
				*problems = append(*problems, fmt.Sprintf("line %d: %s is not a setting (%s)", k.Line, at, takes(path, fields)))
				continue
			}
			keys[v.Line] = at
			walkKeys(v, ft, at, keys, problems)
		}
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, item := range n.Content {
			walkKeys(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), keys, problems)
		}
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// takes words the keys a section accepts, for an unknown key's error.
func takes(path string, fields map[string]reflect.Type) string {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	sort.Strings(names)
	if path == "" {
		path = "router.yaml"
	}
	return path + " takes " + strings.Join(names, ", ")
}

var (
	// yaml.v3 words a value of the wrong kind as "line 3: cannot unmarshal !!str `abc` into
	// int" (a scalar) or "line 3: cannot unmarshal !!seq into struct { … }".
	typeError = regexp.MustCompile("^cannot unmarshal !!([a-z]+)(?: `(.*)`)? into (.+)$")
	// and a key a merge (<<) brings in that its section does not take as "line 3: field x not
	// found in type struct { … }".
	unknownField = regexp.MustCompile(`^field (\S+) not found in type`)
	atLine       = regexp.MustCompile("^line ([0-9]+): (.*)$")
)

// wrongKind rewords one of the decoder's type errors ("line N: …") with the path of the key at
// that line, and yaml.v3's own in the kind of value the key takes instead of a Go type.
func wrongKind(msg string, keys map[int]string) string {
	m := atLine.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	line, _ := strconv.Atoi(m[1])
	key, rest := keys[line], m[2]
	if key == "" {
		key = "a value"
	}
	if t := typeError.FindStringSubmatch(rest); t != nil {
		value := map[string]string{"map": "a mapping", "seq": "a list"}[t[1]]
		if value == "" {
			value = strconv.Quote(t[2])
		}
		rest = fmt.Sprintf("%s is not %s", value, kindOf(t[3]))
	} else if u := unknownField.FindStringSubmatch(rest); u != nil {
		rest = fmt.Sprintf("%s, merged in here, is not a setting", u[1])
	}
	return fmt.Sprintf("line %d: %s: %s", line, key, rest)
}

// kindOf words a Go type's name from a yaml.v3 error as the kind of value it takes.
func kindOf(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "a whole number"
	case goType == "bool":
		return "true or false"
	case goType == "string":
		return "text"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	default:
		return "a mapping of settings"
	}
}
