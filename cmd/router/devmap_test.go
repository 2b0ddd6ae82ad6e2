package main

import (
	"testing"

	"gopkg.in/yaml.v3"
)

// A kept sandbox's map keeps the user's formatting on restart: only the dsn values change.
func TestRewriteDSNsKeepsFormatting(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"block, odd indentation and comments",
			"# my sandbox\nversion: 3   # moved a range\nshards:\n-   name: shard-0\n    dsn: postgres://old@127.0.0.1:1/a   # port changes\n    ranges:\n      - \"-40\"\n-   name: shard-1\n    dsn:    'postgres://old@127.0.0.1:2/b'\n    ranges: [\"40-\"]\n",
			"# my sandbox\nversion: 3   # moved a range\nshards:\n-   name: shard-0\n    dsn: postgres://new@127.0.0.1:5/a   # port changes\n    ranges:\n      - \"-40\"\n-   name: shard-1\n    dsn:    'postgres://new@127.0.0.1:6/b'\n    ranges: [\"40-\"]\n"},
		{"flow mappings, double quotes",
			"version: 1\nshards:\n  - {name: shard-0, dsn: \"postgres://old@127.0.0.1:1/a\", ranges: [\"-80\"]}\n  - {name: shard-1, dsn: postgres://old@127.0.0.1:2/b, ranges: [\"80-\"]}\n",
			"version: 1\nshards:\n  - {name: shard-0, dsn: \"postgres://new@127.0.0.1:5/a\", ranges: [\"-80\"]}\n  - {name: shard-1, dsn: postgres://new@127.0.0.1:6/b, ranges: [\"80-\"]}\n"},
	} {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(tc.in), &doc); err != nil {
			t.Fatal(err)
		}
		out, ok := rewriteDSNs([]byte(tc.in), &doc, []string{"postgres://new@127.0.0.1:5/a", "postgres://new@127.0.0.1:6/b"})
		if !ok || string(out) != tc.want {
			t.Errorf("%s: ok %t\n got %q\nwant %q", tc.name, ok, out, tc.want)
		}
	}
}

// A DSN that plain YAML would misread is quoted; a multi-line value is left to the fallback.
func TestRewriteDSNsQuotesAndFallsBack(t *testing.T) {
	in := "shards:\n  - name: s\n    dsn: host=a\n"
	var doc yaml.Node
	yaml.Unmarshal([]byte(in), &doc)
	out, ok := rewriteDSNs([]byte(in), &doc, []string{"host=b password='x #y'"})
	var back struct{ Shards []struct{ DSN string } }
	if err := yaml.Unmarshal(out, &back); !ok || err != nil || back.Shards[0].DSN != "host=b password='x #y'" {
		t.Errorf("quoted rewrite: ok %t, %q reads back as %+v (%v)", ok, out, back, err)
	}
	in = "shards:\n  - name: s\n    dsn: >\n      host=a\n"
	yaml.Unmarshal([]byte(in), &doc)
	if _, ok := rewriteDSNs([]byte(in), &doc, []string{"host=b"}); ok {
		t.Errorf("a folded dsn was rewritten in place")
	}
}
