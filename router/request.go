package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// maxReferenceLen is the longest "reference" a transfer may carry, in characters.
const maxReferenceLen = 140

// errBadBody marks an error as the client's: malformed or invalid JSON.
var errBadBody = errors.New("invalid request body")

func badBody(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadBody, fmt.Sprintf(format, args...))
}

// DecodeTransfer decodes body, one JSON object. It accepts exactly the fields of a transfer
// (src, dst, amount, currency, reference), each at most once and of its exact type: integers
// must be written as integers (2500, not 2500.0 or 2.5e3) and fit in int64; strings must be
// valid UTF-8 with no lone surrogate escapes. Anything else is an error wrapping errBadBody that
// names the problem. It takes the body whole, read within the size limit, so that "too large"
// is known first.
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
