package router

import (
	"slices"
	"strconv"
	"unicode/utf8"
)

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
