package router

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// errBadKey is wrapped by every Idempotency-Key parse error.
var errBadKey = errors.New("invalid Idempotency-Key")

// maxKeyLen is the longest Idempotency-Key the router accepts, in characters (all ASCII).
const maxKeyLen = 255

// ParseIdempotencyKey accepts a key in the IETF structured-field form (an RFC 8941 sf-string,
// "9f1c…") or bare (9f1c…), and returns it unquoted. A key is 1-255 visible ASCII characters
// (0x21-0x7e).
//
// The sf-string form is an Item, which RFC 8941 lets carry parameters: `"9f1c…";v=1`. They are
// accepted, parsed strictly as §3.1.2 and §4.2.3.2 say (each is ";", optional spaces, a key of
// a-z 0-9 _ - . * that starts with a-z or *, and optionally "=" and a bare item: integer,
// decimal, string, token, byte sequence or boolean), and then ignored: no parameter means
// anything for this header, so the key alone is the key, and `"abc";x=1` and `abc` are one key.
// Malformed parameters are an error like any other malformed header. The bare form has no
// parameters: there a ';' is a character of the key, as it always was.
func ParseIdempotencyKey(header string) (string, error) {
	v := strings.Trim(header, " \t")
	if strings.HasPrefix(v, `"`) {
		key, rest, err := parseSFString(v)
		if err != nil {
			return "", fmt.Errorf("%w: %w", errBadKey, err)
		}
		if err := checkParameters(rest); err != nil {
			return "", fmt.Errorf("%w: %w", errBadKey, err)
		}
		v = key
	}
	if v == "" {
		return "", fmt.Errorf("%w: it is empty", errBadKey)
	}
	if len(v) > maxKeyLen {
		return "", fmt.Errorf("%w: it is %d characters; at most %d are allowed", errBadKey, len(v), maxKeyLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return "", fmt.Errorf("%w: character %d is not visible ASCII (allowed: ! to ~, no spaces)", errBadKey, i+1)
		}
	}
	return v, nil
}

// parseSFString reads the sf-string that s starts with (RFC 8941 §4.2.5) and returns its value
// and what follows its closing quote.
func parseSFString(s string) (value, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", "", errors.New(`in the quoted form only \" and \\ may follow a backslash`)
			}
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), s[i+1:], nil
		case c < 0x20 || c > 0x7e:
			return "", "", fmt.Errorf("character %d of the quoted form is not printable ASCII", i+1)
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errors.New("the quoted form is missing its closing quote")
}

// checkParameters checks that s, what follows an sf-string, is RFC 8941 parameters or nothing.
func checkParameters(s string) error {
	for s != "" {
		if s[0] != ';' {
			return errors.New(`after the closing quote only parameters (;name or ;name=value, RFC 8941 §3.1.2) may follow`)
		}
		s = strings.TrimLeft(s[1:], " ")
		n := paramKeyLen(s)
		if n == 0 {
			return errors.New("a parameter name must start with a-z or * and hold only a-z 0-9 _ - . *")
		}
		name := s[:n]
		s = s[n:]
		if !strings.HasPrefix(s, "=") {
			continue // a parameter without a value is true
		}
		n, err := bareItemLen(s[1:])
		if err != nil {
			return fmt.Errorf("parameter %s: %w", quote(name), err)
		}
		s = s[1+n:]
	}
	return nil
}

// paramKeyLen is the length of the RFC 8941 key that s starts with, or 0:
// ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" ).
func paramKeyLen(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', c == '*':
		case i > 0 && ('0' <= c && c <= '9' || c == '_' || c == '-' || c == '.'):
		default:
			return i
		}
	}
	return len(s)
}

// bareItemLen is the length of the RFC 8941 bare item that s starts with (§4.2.3.1).
func bareItemLen(s string) (int, error) {
	switch {
	case s == "":
		return 0, errors.New("the value is missing after =")
	case s[0] == '-' || isDigit(s[0]):
		return numberLen(s)
	case s[0] == '"':
		_, rest, err := parseSFString(s)
		return len(s) - len(rest), err
	case s[0] == '*' || isAlpha(s[0]):
		return tokenLen(s), nil
	case s[0] == ':':
		return binaryLen(s)
	case s[0] == '?':
		if len(s) < 2 || (s[1] != '0' && s[1] != '1') {
			return 0, errors.New("a boolean is ?0 or ?1")
		}
		return 2, nil
	}
	return 0, errors.New("the value is not an integer, decimal, string, token, byte sequence or boolean")
}

// numberLen is the length of the sf-integer or sf-decimal s starts with (§4.2.4): at most 15
// digits, or at most 12 digits, ".", and 1 to 3 digits.
func numberLen(s string) (int, error) {
	i := 0
	if s[0] == '-' {
		i++
	}
	start, dot := i, -1
	for ; i < len(s); i++ {
		if s[i] == '.' && dot < 0 {
			dot = i
		} else if !isDigit(s[i]) {
			break
		}
	}
	switch {
	case i == start || !isDigit(s[start]):
		return 0, errors.New("a number must start with a digit")
	case dot < 0 && i-start > 15:
		return 0, errors.New("an integer has at most 15 digits")
	case dot >= 0 && (dot-start > 12 || i-dot-1 < 1 || i-dot-1 > 3):
		return 0, errors.New("a decimal has at most 12 digits before the point and 1 to 3 after it")
	}
	return i, nil
}

// tokenLen is the length of the sf-token s starts with (§4.2.6): its first character is a
// letter or "*", then tchar, ":" or "/".
func tokenLen(s string) int {
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlpha(c) && !isDigit(c) && !strings.ContainsRune("!#$%&'*+-.^_`|~:/", rune(c)) {
			return i
		}
	}
	return len(s)
}

// binaryLen is the length of the sf-binary s starts with (§4.2.7): base64 between colons,
// padding optional.
func binaryLen(s string) (int, error) {
	end := strings.IndexByte(s[1:], ':')
	if end < 0 {
		return 0, errors.New("a byte sequence is missing its closing colon")
	}
	content := s[1 : 1+end]
	invalid := func(c rune) bool {
		return c > 0x7f || !isAlpha(byte(c)) && !isDigit(byte(c)) && c != '+' && c != '/' && c != '='
	}
	// The decoder alone would also skip newlines.
	if _, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(content, "=")); err != nil || strings.ContainsFunc(content, invalid) {
		return 0, errors.New("a byte sequence must be base64 between colons")
	}
	return end + 2, nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isAlpha(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
