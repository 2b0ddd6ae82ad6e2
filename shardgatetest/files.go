package shardgatetest

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// routerYAML writes router.yaml for o (with its defaults applied): listen, the shard map's file
// name, the retention and the clients' token hashes, with o.RouterYAML merged over it.
func routerYAML(o Options, listen string) ([]byte, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nshardmap: shardmap.yaml\n", listen)
	fmt.Fprintf(&b, "idempotency:\n  retention: %s\n  replay_window: %s\n", o.Retention, o.ReplayWindow)
	b.WriteString("auth:\n  mode: tokens\n  clients:\n")
	for _, name := range slices.Sorted(maps.Keys(o.Clients)) {
		fmt.Fprintf(&b, "    - name: %q\n      token_sha256: %x\n", name, sha256.Sum256([]byte(o.Clients[name])))
	}
	return mergeYAML([]byte(b.String()), []byte(o.RouterYAML))
}

// ownedKeys are the router.yaml keys the package writes and Options.RouterYAML may not set.
var ownedKeys = []string{"listen", "shardmap", "auth"}

// mergeYAML lays the mapping extra over base, key by key at every depth: a key of extra
// replaces base's, except that two mappings merge.
func mergeYAML(base, extra []byte) ([]byte, error) {
	var b, e yaml.Node
	if err := yaml.Unmarshal(base, &b); err != nil {
		return nil, fmt.Errorf("shardgatetest: generated router.yaml: %w", err)
	}
	if err := yaml.Unmarshal(extra, &e); err != nil {
		return nil, fmt.Errorf("shardgatetest: Options.RouterYAML: %w", err)
	}
	if e.Kind == 0 { // empty
		return base, nil
	}
	if len(e.Content) != 1 || e.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("shardgatetest: Options.RouterYAML must be a YAML mapping of router.yaml keys")
	}
	for i := 0; i < len(e.Content[0].Content); i += 2 {
		if k := e.Content[0].Content[i].Value; slices.Contains(ownedKeys, k) {
			return nil, fmt.Errorf("shardgatetest: Options.RouterYAML sets %q (line %d), which the package writes: use Options.Clients for tokens", k, e.Content[0].Content[i].Line)
		}
	}
	mergeMapping(b.Content[0], e.Content[0])
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(&b); err != nil {
		return nil, fmt.Errorf("shardgatetest: router.yaml: %w", err)
	}
	return out.Bytes(), nil
}

// mergeMapping sets every key of src in dst; where both hold a mapping, it merges them.
func mergeMapping(dst, src *yaml.Node) {
	for i := 0; i+1 < len(src.Content); i += 2 {
		key, val := src.Content[i], src.Content[i+1]
		j := keyIndex(dst, key.Value)
		switch {
		case j < 0:
			dst.Content = append(dst.Content, key, val)
		case dst.Content[j+1].Kind == yaml.MappingNode && val.Kind == yaml.MappingNode:
			mergeMapping(dst.Content[j+1], val)
		default:
			dst.Content[j+1] = val
		}
	}
}

// keyIndex is the index of key's node in the mapping m, or -1.
func keyIndex(m *yaml.Node, key string) int {
	for j := 0; j+1 < len(m.Content); j += 2 {
		if m.Content[j].Value == key {
			return j
		}
	}
	return -1
}

// evenRanges splits the keyspace over n shards on one-byte boundaries, as `router dev` does:
// shard i owns [i*256/n, (i+1)*256/n).
func evenRanges(n int) [][]string {
	bound := func(i int) string {
		if i == 0 || i == n {
			return ""
		}
		return fmt.Sprintf("%02x", i*256/n)
	}
	out := make([][]string, n)
	for i := range n {
		out[i] = []string{bound(i) + "-" + bound(i+1)}
	}
	return out
}

// shardmapYAML writes a version-1 shard map giving shard i the DSN dsns[i] and ranges[i].
func shardmapYAML(dsns []string, ranges [][]string) []byte {
	var b bytes.Buffer
	b.WriteString("version: 1\nshards:\n")
	for i, dsn := range dsns {
		quoted := make([]string, len(ranges[i]))
		for j, r := range ranges[i] {
			quoted[j] = fmt.Sprintf("%q", r)
		}
		fmt.Fprintf(&b, "  - name: %s\n    dsn: %s\n    ranges: [%s]\n", shardName(i), dsn, strings.Join(quoted, ", "))
	}
	return b.Bytes()
}
