package router

import "time"

// keyTime returns the creation time embedded in an Idempotency-Key that is a UUIDv7 (RFC 9562)
// in canonical form: 8-4-4-4-12 hex digits (either case), version nibble 7, variant bits 10.
// Its first 48 bits are milliseconds since the Unix epoch. Any other key returns false: its age
// cannot be known from the key alone.
//
// This is how a key older than retention is told apart from a new one even after its record has
// been dropped: the router answers 422 idempotency-key-expired instead of applying it.
func keyTime(key string) (time.Time, bool) {
	if len(key) != 36 || key[14] != '7' || !isVariantRFC9562(key[19]) {
		return time.Time{}, false
	}
	var ms int64
	for i := 0; i < len(key); i++ {
		switch i {
		case 8, 13, 18, 23:
			if key[i] != '-' {
				return time.Time{}, false
			}
			continue
		}
		d, ok := hexValue(key[i])
		if !ok {
			return time.Time{}, false
		}
		if i < 13 { // hex digits 0-11: the 48-bit unix_ts_ms field
			ms = ms<<4 | int64(d)
		}
	}
	return time.UnixMilli(ms).UTC(), true
}

// isVariantRFC9562 reports whether hex digit c starts with the bits 10 (8, 9, a or b).
func isVariantRFC9562(c byte) bool {
	switch c {
	case '8', '9', 'a', 'b', 'A', 'B':
		return true
	}
	return false
}

func hexValue(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
