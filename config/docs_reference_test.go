package config

import (
	"bufio"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// referencePath is the router.yaml reference operators read; TestConfigurationReference keeps
// it and the decoder in step.
const referencePath = "../docs/configuration.md"

// referenceRow is one key of the reference: `| `key` | `default` | meaning |`.
type referenceRow struct {
	line     int
	key      string
	fallback string // the default as written, without backticks; "" when the row shows none (—)
}

var referenceRowRE = regexp.MustCompile("^\\| `([a-z0-9_.\\[\\]]+)` \\| (`[^`]*`|—) \\|")

// readReference returns the rows of the router.yaml part of the reference: the tables between
// its "## router.yaml" and the next "## " heading.
func readReference(t *testing.T) []referenceRow {
	t.Helper()
	f, err := os.Open(referencePath)
	if err != nil {
		t.Fatalf("the configuration reference must exist: %v", err)
	}
	defer f.Close()
	var rows []referenceRow
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## router.yaml"
			continue
		}
		if m := referenceRowRE.FindStringSubmatch(line); in && m != nil {
			rows = append(rows, referenceRow{line: n, key: m[1], fallback: strings.Trim(m[2], "`—")})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no key rows under \"## router.yaml\"", referencePath)
	}
	return rows
}

// decoderKeys lists every key path the decoder accepts, the way the reference spells them
// (section.key, list items as name[].key).
func decoderKeys(t reflect.Type, prefix string, out map[string]bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		path := prefix + name
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeOf(duration{}):
			decoderKeys(ft, path+".", out)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			decoderKeys(ft.Elem(), path+"[].", out)
		default:
			out[path] = true
		}
	}
}

// TestConfigurationReference checks docs/configuration.md against the decoder: every key it
// accepts is documented, every documented key is accepted, and every documented default is
// the one withDefaults fills in.
func TestConfigurationReference(t *testing.T) {
	rows := readReference(t)
	accepted := map[string]bool{}
	decoderKeys(reflect.TypeOf(file{}), "", accepted)

	documented := map[string]bool{}
	for _, r := range rows {
		if documented[r.key] {
			t.Errorf("%s:%d: %s is documented twice", referencePath, r.line, r.key)
		}
		documented[r.key] = true
		if !accepted[r.key] {
			t.Errorf("%s:%d: %s is documented but router.yaml has no such key; remove the row or fix its name", referencePath, r.line, r.key)
		}
	}
	var missing []string
	for k := range accepted {
		if !documented[k] {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	for _, k := range missing {
		t.Errorf("%s: router.yaml accepts %s, which has no row in the reference; add `| `%s` | `default` | meaning |`", referencePath, k, k)
	}

	base := defaultsOf(t, "")
	for _, r := range rows {
		if !accepted[r.key] {
			continue // reported above
		}
		if strings.Contains(r.key, "[]") {
			if r.fallback != "" {
				t.Errorf("%s:%d: %s is a list item's key and has no default; write — in its default column", referencePath, r.line, r.key)
			}
			continue
		}
		if r.fallback == "" {
			t.Errorf("%s:%d: %s has a default; write it in backticks in the default column", referencePath, r.line, r.key)
			continue
		}
		got := defaultsOf(t, yamlSetting(r.key, r.fallback))
		if !reflect.DeepEqual(got, base) {
			t.Errorf("%s:%d: %s is documented with default %s, but setting it to that is not the same as leaving it out; write the decoder's default", referencePath, r.line, r.key, r.fallback)
		}
	}
}

// yamlSetting writes one key of router.yaml, nested by its dotted path.
func yamlSetting(key, value string) string {
	parts := strings.Split(key, ".")
	var b strings.Builder
	for i, p := range parts {
		b.WriteString(strings.Repeat("  ", i) + p + ":")
		if i == len(parts)-1 {
			b.WriteString(" " + value)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// defaultsOf decodes data and fills in the defaults, without validation: the reference's
// defaults must hold for every key, including those only valid in combination (auth.mode).
func defaultsOf(t *testing.T, data string) *Config {
	t.Helper()
	f, err := decode([]byte(data))
	if err != nil {
		t.Fatalf("decoding %q: %v", data, err)
	}
	c, problems := withDefaults("router.yaml", f)
	if len(problems) > 0 {
		t.Fatalf("defaults of %q: %v", data, problems)
	}
	return c
}

// TestConfigurationReferenceCatchesMistakes makes sure the reference test can fail: a wrong
// default differs from the decoder's, and a made-up key is not accepted.
func TestConfigurationReferenceCatchesMistakes(t *testing.T) {
	if reflect.DeepEqual(defaultsOf(t, yamlSetting("shard_pool.max_conns", "17")), defaultsOf(t, "")) {
		t.Error("a wrong default for shard_pool.max_conns compared equal to the real one")
	}
	accepted := map[string]bool{}
	decoderKeys(reflect.TypeOf(file{}), "", accepted)
	for _, k := range []string{"group_commit.in_fligth", "auth.clients"} {
		if accepted[k] {
			t.Errorf("decoderKeys lists %s, which is not a leaf key", k)
		}
	}
	for _, k := range []string{"listen", "relay.keep_settled", "auth.clients[].token_sha256", "admin.token_sha256"} {
		if !accepted[k] {
			t.Errorf("decoderKeys misses %s", k)
		}
	}
}
