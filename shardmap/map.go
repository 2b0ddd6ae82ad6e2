package shardmap

import (
	"fmt"
	"sort"

	"github.com/shardgate/shardgate/internal/dsn"
)

// Shard is one PostgreSQL shard and the keyspace ranges it owns.
//
// Its String and GoString methods redact the DSN, so printing a Shard or a
// Map with any fmt verb cannot leak a password.
type Shard struct {
	Name string
	// DSN is the connection string after ${VAR} expansion. It is secret:
	// print RedactedDSN instead. It is omitted from JSON for the same reason.
	DSN string `json:"-"`
	// Ranges are the ranges as listed in the file, in file order.
	Ranges []KeyRange
	// Line is the line of the shard's entry in the file.
	Line int
}

// RedactedDSN returns the DSN with every password replaced by "xxxxx":
// the user-info password and any password or sslpassword parameter of a
// URL, and password=... settings of a key=value DSN. A DSN that does not
// parse is returned as "xxxxx" entirely. The result is safe for logs.
func (s Shard) RedactedDSN() string { return dsn.Redact(s.DSN) }

// Scrub returns text with every password of the shard's DSN replaced by
// "xxxxx", in each spelling it can take there: as written, unquoted and
// unescaped, and URL-decoded. Use it on error text that a library built
// from the DSN, such as a pgx parse error, whose own redaction is best
// effort and misses forms libpq accepts (password = 'a b').
func (s Shard) Scrub(text string) string { return dsn.Scrub(s.DSN, text) }

// String describes the shard for logs, with its DSN redacted.
func (s Shard) String() string {
	return fmt.Sprintf("%s %v %s", s.Name, s.Ranges, s.RedactedDSN())
}

// GoString makes %#v redact the DSN too.
func (s Shard) GoString() string {
	return fmt.Sprintf("shardmap.Shard{Name:%q, DSN:%q, Ranges:%v, Line:%d}", s.Name, s.RedactedDSN(), s.Ranges, s.Line)
}

// Map is a validated shard map: its ranges cover the keyspace exactly once.
//
// A Map comes only from [Parse] or [Load] and must not be modified: its
// lookup index is built from the shards at parse time. It is safe for
// concurrent readers.
type Map struct {
	Version int64
	Shards  []Shard
	// index holds every range sorted by start; starts at 0, no gaps, no
	// overlaps, so the owner of an id is the last entry starting at or below
	// it, found by binary search.
	index []placedRange
}

// ShardFor returns the shard owning id and the range that contains it.
// It always succeeds on a Map from Parse.
func (m *Map) ShardFor(id uint64) (*Shard, KeyRange) {
	i := sort.Search(len(m.index), func(i int) bool { return m.index[i].r.start > id }) - 1
	p := m.index[i]
	return &m.Shards[p.shard], p.r
}

// Shard returns the shard named name, or nil.
func (m *Map) Shard(name string) *Shard {
	for i := range m.Shards {
		if m.Shards[i].Name == name {
			return &m.Shards[i]
		}
	}
	return nil
}

// Ownership lists, per shard name, the ranges the shard owns in keyspace
// order: what each shard is told it owns, so that it can refuse writes for
// keys it no longer owns. Adjacent ranges are not merged; they are as
// written in the file.
func (m *Map) Ownership() map[string][]KeyRange {
	own := make(map[string][]KeyRange, len(m.Shards))
	for _, p := range m.index {
		name := m.Shards[p.shard].Name
		own[name] = append(own[name], p.r)
	}
	return own
}

// Route is where one account's transfers go.
type Route struct {
	Account    int64
	KeyspaceID uint64
	Range      KeyRange
	Shard      string
}

// Route returns the route of account under m.
func (m *Map) Route(account int64) Route {
	id := KeyspaceID(account)
	s, r := m.ShardFor(id)
	return Route{Account: account, KeyspaceID: id, Range: r, Shard: s.Name}
}

// String formats r as "account 8842 keyspace_id 1d65d16c18855fc7 range -80
// shard shard-a": space-separated key-value pairs, the keyspace id as 16
// hex digits as xxhsum prints it.
func (r Route) String() string {
	return fmt.Sprintf("account %d keyspace_id %016x range %s shard %s", r.Account, r.KeyspaceID, r.Range, r.Shard)
}
