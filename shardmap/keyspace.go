package shardmap

import (
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// KeyspaceID returns the keyspace id of account: XXH64 with seed 0 of the
// account's decimal ASCII text ("8842" -> 0x1d65d16c18855fc7), the value
// `echo -n 8842 | xxhsum -H1` prints. Hashing the text rather than the
// binary integer keeps the id reproducible from a shell, in SQL and in other
// languages without agreeing on a byte order.
func KeyspaceID(account int64) uint64 {
	var buf [20]byte // len("-9223372036854775808")
	return xxhash.Sum64(strconv.AppendInt(buf[:0], account, 10))
}
