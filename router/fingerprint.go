package router

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
)

// Fingerprint identifies "the same request": method, path and the canonical parsed body (so key
// order, whitespace and an omitted default currency do not matter). It is the hex SHA-256 of a
// fixed-order encoding: the canonical body is byte for byte json.Marshal(in), which is what
// fingerprints stored on the shards were made of, built in a stack buffer instead.
func Fingerprint(method, path string, in TransferInput) string {
	var buf [256]byte
	b := append(buf[:0], method...)
	b = append(b, '\n')
	b = append(b, path...)
	b = append(b, '\n', '{')
	b = appendTransferFields(b, in)
	b = append(b, '}')
	sum := sha256.Sum256(b)
	var digits [2 * sha256.Size]byte
	hex.Encode(digits[:], sum[:])
	return string(digits[:])
}

// appendTransferFields appends in's fields as json.Marshal(in) writes them, without the braces,
// so that the fingerprint and the 201 body share one encoding.
func appendTransferFields(b []byte, in TransferInput) []byte {
	b = append(b, `"src":`...)
	b = strconv.AppendInt(b, in.Src, 10)
	b = append(b, `,"dst":`...)
	b = strconv.AppendInt(b, in.Dst, 10)
	b = append(b, `,"amount":`...)
	b = strconv.AppendInt(b, in.Amount, 10)
	b = append(b, `,"currency":`...)
	b = appendJSONString(b, in.Currency)
	if in.Reference != "" {
		b = append(b, `,"reference":`...)
		b = appendJSONString(b, in.Reference)
	}
	return b
}

// appendJSONString appends s quoted as encoding/json quotes it. Printable ASCII that it leaves
// alone is copied; anything else (quotes, backslashes, control characters, <, >, & and non-ASCII
// text such as U+2028 or invalid UTF-8) is left to encoding/json, so its escaping rules are
// never restated here.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			quoted, _ := json.Marshal(s) // a string cannot fail to encode
			return append(b, quoted...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
