package router

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// TransferInput is a validated POST /transfers body, with the default currency applied.
type TransferInput struct {
	Src       int64  `json:"src"`
	Dst       int64  `json:"dst"`
	Amount    int64  `json:"amount"`
	Currency  string `json:"currency"`
	Reference string `json:"reference,omitempty"`
}

// maxReferenceLen is SPEC's limit on "reference", in characters.
const maxReferenceLen = 140

// errBadBody marks an error as the client's: malformed or invalid JSON.
var errBadBody = errors.New("invalid request body")

func badBody(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadBody, fmt.Sprintf(format, args...))
}

// DecodeTransfer decodes body, one JSON object. It accepts exactly the fields SPEC names, each
// at most once and of its exact type: integers must be written as integers (2500, not 2500.0 or
// 2.5e3) and fit in int64; strings must be valid UTF-8 with no lone surrogate escapes. Anything
// else is an error wrapping errBadBody that names the problem. It takes the body whole, read
// within the size limit, so that "too large" is known first.
func DecodeTransfer(body []byte, defaultCurrency string) (TransferInput, error) {
	in, hasCurrency, ok := scanPlainTransfer(body)
	if !ok {
		var seen map[string]bool
		var err error
		if in, seen, err = decodeFields(body); err != nil {
			return in, err
		}
		hasCurrency = seen["currency"]
	}
	if !hasCurrency {
		in.Currency = defaultCurrency
	}
	return in, validateTransfer(in)
}

// scanPlainTransfer is decodeFields for the bodies clients send, at a fraction of its cost: one
// object of known fields, each once, integers as plain integers in range, strings of valid UTF-8
// without escapes or control characters. It reports !ok for anything else, even what is valid,
// and decodeFields then decides (and words every error): so it accepts a subset of what
// decodeFields accepts, with the same result.
func scanPlainTransfer(body []byte) (in TransferInput, hasCurrency, ok bool) {
	p := plainScanner{b: body}
	if !p.consume('{') {
		return in, false, false
	}
	var seen [len(transferFields)]bool
	for {
		name, ok := p.plainString()
		if !ok || !p.consume(':') {
			return in, false, false
		}
		f := slices.Index(transferFields[:], string(name))
		if f < 0 || seen[f] || !p.field(f, &in) {
			return in, false, false
		}
		seen[f] = true
		if p.consume('}') {
			break
		}
		if !p.consume(',') {
			return in, false, false
		}
	}
	p.skipSpace()
	if p.i != len(p.b) || !seen[fieldSrc] || !seen[fieldDst] || !seen[fieldAmount] {
		return in, false, false
	}
	return in, seen[fieldCurrency], true
}

// transferFields are the body's fields, indexed by the field* constants.
var transferFields = [...]string{"src", "dst", "amount", "currency", "reference"}

const (
	fieldSrc = iota
	fieldDst
	fieldAmount
	fieldCurrency
	fieldReference
)

// plainScanner reads the plain JSON that scanPlainTransfer accepts; every method reports false
// for anything else.
type plainScanner struct {
	b []byte
	i int // the next byte to read
}

// field reads the value of field f into in.
func (p *plainScanner) field(f int, in *TransferInput) bool {
	var ok bool
	switch f {
	case fieldSrc:
		in.Src, ok = p.integer()
	case fieldDst:
		in.Dst, ok = p.integer()
	case fieldAmount:
		in.Amount, ok = p.integer()
	case fieldCurrency:
		in.Currency, ok = p.stringValue()
	case fieldReference:
		in.Reference, ok = p.stringValue()
	}
	return ok
}

// skipSpace skips what JSON counts as whitespace.
func (p *plainScanner) skipSpace() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

// consume skips whitespace and then c, if c is next.
func (p *plainScanner) consume(c byte) bool {
	p.skipSpace()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// plainString reads a string that needs no unescaping: valid UTF-8 with no backslash and no
// control character (which JSON does not allow unescaped), and returns its content.
func (p *plainScanner) plainString() ([]byte, bool) {
	if !p.consume('"') {
		return nil, false
	}
	start, ascii := p.i, true
	for ; p.i < len(p.b); p.i++ {
		switch c := p.b[p.i]; {
		case c == '"':
			s := p.b[start:p.i]
			p.i++
			return s, ascii || utf8.Valid(s)
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return nil, false
}

// stringValue is plainString as a Go string.
func (p *plainScanner) stringValue() (string, bool) {
	s, ok := p.plainString()
	return string(s), ok
}

// integer reads a JSON integer without fraction or exponent (-?(0|[1-9][0-9]*)) that fits in
// int64. A fraction or exponent is left unread, where the caller's ',' or '}' will not match.
func (p *plainScanner) integer() (int64, bool) {
	p.skipSpace()
	start := p.i
	if p.i < len(p.b) && p.b[p.i] == '-' {
		p.i++
	}
	digits := p.i
	for p.i < len(p.b) && isDigit(p.b[p.i]) {
		p.i++
	}
	if p.i == digits || p.i-digits > 1 && p.b[digits] == '0' {
		return 0, false
	}
	v, err := strconv.ParseInt(string(p.b[start:p.i]), 10, 64)
	return v, err == nil
}

// decodeFields reads the object's fields, refusing unknown, repeated, missing and mistyped ones.
func decodeFields(body []byte) (TransferInput, map[string]bool, error) {
	var in TransferInput
	tr := tokenReader{dec: json.NewDecoder(bytes.NewReader(body)), body: body}
	tr.dec.UseNumber()
	tok, err := tr.next(func(string) string { return "the body" })
	if err != nil {
		return in, nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return in, nil, badBody("must be a JSON object")
	}
	seen := map[string]bool{}
	for tr.dec.More() {
		tok, err := tr.next(func(name string) string { return "field name " + quote(name) })
		if err != nil {
			return in, nil, err
		}
		name := tok.(string) // inside an object the decoder only yields string keys
		if seen[name] {
			return in, nil, badBody("field %s appears twice", quote(name))
		}
		seen[name] = true
		val, err := tr.next(func(string) string { return "field " + quote(name) })
		if err != nil {
			return in, nil, err
		}
		switch name {
		case "src":
			in.Src, err = intField(name, val)
		case "dst":
			in.Dst, err = intField(name, val)
		case "amount":
			in.Amount, err = intField(name, val)
		case "currency":
			in.Currency, err = stringField(name, val)
		case "reference":
			in.Reference, err = stringField(name, val)
		default:
			err = badBody("unknown field %s (allowed: src, dst, amount, currency, reference)", quote(name))
		}
		if err != nil {
			return in, nil, err
		}
	}
	if _, err := tr.dec.Token(); err != nil { // the closing brace
		return in, nil, notJSON(err)
	}
	if _, err := tr.dec.Token(); err != io.EOF {
		return in, nil, badBody("unexpected data after the JSON object")
	}
	for _, f := range []string{"src", "dst", "amount"} {
		if !seen[f] {
			return in, nil, badBody("field %q is required", f)
		}
	}
	return in, seen, nil
}

// validateTransfer checks the rules a well-formed transfer must also follow.
func validateTransfer(in TransferInput) error {
	if in.Amount <= 0 {
		return badBody("amount must be a positive integer in minor units, got %d", in.Amount)
	}
	if in.Src == in.Dst {
		return badBody("src and dst must differ (both are %d)", in.Src)
	}
	if !isCurrencyCode(in.Currency) {
		return badBody("currency %s must be an ISO 4217 code: three upper-case letters such as EUR", quote(in.Currency))
	}
	if n := utf8.RuneCountInString(in.Reference); n > maxReferenceLen {
		return badBody("reference is %d characters; at most %d are allowed", n, maxReferenceLen)
	}
	if strings.ContainsFunc(in.Reference, unicode.IsControl) {
		return badBody("reference must not contain control characters")
	}
	return nil
}

// tokenReader yields the tokens of body, checking the raw text of every string first:
// encoding/json silently turns invalid UTF-8 and lone surrogate escapes (\ud800) into U+FFFD, so
// two different bodies would otherwise decode, and fingerprint, the same.
type tokenReader struct {
	dec  *json.Decoder
	body []byte
}

// next returns the next token. A string's problem is told by what, given the string as decoded
// (with U+FFFD for what was wrong), to name it: field "reference", or field name "sr�c".
func (tr *tokenReader) next(what func(decoded string) string) (json.Token, error) {
	start := tr.dec.InputOffset()
	tok, err := tr.dec.Token()
	if err != nil {
		return nil, notJSON(err)
	}
	if str, ok := tok.(string); ok {
		// The raw text runs from the end of the previous token (so it may start with
		// whitespace, ',' or ':', none of which can upset the checks) to the closing quote.
		if problem := rawStringProblem(tr.body[start:tr.dec.InputOffset()]); problem != "" {
			return nil, badBody("%s %s", what(str), problem)
		}
	}
	return tok, nil
}

// rawStringProblem says what is wrong with raw, the text of a JSON string the decoder accepted,
// or returns "". The decoder has checked the escapes' syntax: a backslash is followed by one
// escape character, and \u by four hex digits.
func rawStringProblem(raw []byte) string {
	if !utf8.Valid(raw) {
		return "is not valid UTF-8; send JSON as UTF-8"
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		i++ // the escape character
		if i+4 >= len(raw) || raw[i] != 'u' {
			continue
		}
		r := hex4(raw[i+1 : i+5])
		if utf16.IsSurrogate(r) && r < 0xdc00 && i+10 < len(raw) && raw[i+5] == '\\' && raw[i+6] == 'u' {
			if low := hex4(raw[i+7 : i+11]); low >= 0xdc00 && low <= 0xdfff {
				i += 10 // a high and a low surrogate: one character
				continue
			}
		}
		if utf16.IsSurrogate(r) {
			return fmt.Sprintf("contains %s, a lone surrogate escape (not a character); escape a character outside the BMP as a pair such as \\ud83d\\ude00, or send it as UTF-8", raw[i-1:i+5])
		}
		i += 4
	}
	return ""
}

// hex4 is the value of four hex digits the JSON decoder has already checked.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		d, _ := hexValue(c)
		r = r<<4 | rune(d)
	}
	return r
}

// notJSON wraps a decoding error.
func notJSON(err error) error {
	return fmt.Errorf("%w: not JSON: %w", errBadBody, err)
}

func intField(name string, tok json.Token) (int64, error) {
	num, ok := tok.(json.Number)
	if !ok {
		return 0, badBody("field %q must be an integer, got %s", name, describe(tok))
	}
	v, err := strconv.ParseInt(string(num), 10, 64)
	if err != nil {
		return 0, badBody("field %q must be an integer between -9223372036854775808 and 9223372036854775807, got %s", name, clip(string(num)))
	}
	return v, nil
}

func stringField(name string, tok json.Token) (string, error) {
	s, ok := tok.(string)
	if !ok {
		return "", badBody("field %q must be a string, got %s", name, describe(tok))
	}
	return s, nil
}

func describe(tok json.Token) string {
	switch v := tok.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "the number " + clip(string(v))
	case string:
		return "a string"
	case json.Delim:
		if v == '{' {
			return "an object"
		}
		return "an array"
	}
	return fmt.Sprintf("%T", tok)
}

func isCurrencyCode(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

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
