package shardmap

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// redacted replaces secrets in anything printed. It is the same mask
// net/url uses, so URL and key=value DSNs look alike in logs.
const redacted = "xxxxx"

// expandVars replaces every ${NAME} in s with lookupEnv(NAME), once: text
// coming from the environment is not expanded again. A '$' not followed by
// '{' is literal, so passwords containing '$' need no escaping. It returns
// the names that are unset (each once, in order of appearance) and whether
// a "${" does not start a well-formed ${NAME}; such a typo is reported
// rather than kept as literal text because it would otherwise surface later
// as a confusing connection failure. A nil lookupEnv treats every variable
// as unset.
func expandVars(s string, lookupEnv func(string) (string, bool)) (out string, unset []string, malformed bool) {
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), unset, malformed
		}
		b.WriteString(s[:i])
		s = s[i+2:]
		j := strings.IndexByte(s, '}')
		if j < 0 || !isIdent(s[:j]) {
			malformed = true
			b.WriteString("${")
			continue
		}
		name := s[:j]
		s = s[j+1:]
		var val string
		ok := false
		if lookupEnv != nil {
			val, ok = lookupEnv(name)
		}
		if !ok {
			if !slices.Contains(unset, name) {
				unset = append(unset, name)
			}
			continue
		}
		b.WriteString(val)
	}
}

// isIdent reports whether s is a shell-style name: a letter or '_', then
// letters, digits and '_'. Both variable names and libpq keywords have this
// form.
func isIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		letter := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		digit := '0' <= c && c <= '9'
		if !letter && (i == 0 || !digit) {
			return false
		}
	}
	return true
}

// isURLDSN applies libpq's rule: a connection string is a URI exactly when
// it starts with one of these schemes; anything else is key=value.
func isURLDSN(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// checkDSN reports whether dsn is a postgres URL or a libpq key=value
// string. Its messages never quote the DSN: the DSN holds a password.
func checkDSN(dsn string) error {
	if isURLDSN(dsn) {
		// url.Parse's error quotes the whole input, password included, so
		// it is deliberately not wrapped.
		if _, err := url.Parse(dsn); err != nil {
			return errors.New("is not a valid postgres:// URL")
		}
		return nil
	}
	if _, err := parseKeyValueDSN(dsn); err != nil {
		return fmt.Errorf("is neither a postgres:// URL nor a key=value connection string: %w", err)
	}
	return nil
}

// kvPair locates one keyword=value setting in a key=value DSN; the value
// is dsn[valStart:valEnd] including any quotes.
type kvPair struct {
	key              string
	valStart, valEnd int
}

// parseKeyValueDSN splits a libpq key=value connection string following
// libpq's own conninfo_parse: blanks around '=' are allowed, a value is
// either single-quoted or runs to the next blank, and a backslash escapes
// the next character in both forms. Errors name positions and keywords but
// never values.
func parseKeyValueDSN(dsn string) ([]kvPair, error) {
	var pairs []kvPair
	i := 0
	skipBlanks := func() {
		for i < len(dsn) && isBlank(dsn[i]) {
			i++
		}
	}
	for {
		skipBlanks()
		if i == len(dsn) {
			break
		}
		k := i
		for i < len(dsn) && dsn[i] != '=' && !isBlank(dsn[i]) {
			i++
		}
		key := dsn[k:i]
		if !isIdent(key) {
			return nil, fmt.Errorf("setting %d does not start with a keyword such as host or dbname", len(pairs)+1)
		}
		skipBlanks()
		if i == len(dsn) || dsn[i] != '=' {
			return nil, fmt.Errorf("missing '=' after %q", key)
		}
		i++
		skipBlanks()
		v := i
		if i < len(dsn) && dsn[i] == '\'' {
			i++
			for i < len(dsn) && dsn[i] != '\'' {
				if dsn[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(dsn) {
				return nil, fmt.Errorf("unterminated quoted value for %q", key)
			}
			i++ // closing quote
		} else {
			for i < len(dsn) && !isBlank(dsn[i]) {
				if dsn[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i, len(dsn)) // a trailing backslash escapes nothing
		}
		pairs = append(pairs, kvPair{key: key, valStart: v, valEnd: i})
	}
	if len(pairs) == 0 {
		return nil, errors.New("it has no settings")
	}
	return pairs, nil
}

// isBlank matches C isspace in the "C" locale, which libpq uses.
func isBlank(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// isSecretKey matches password and sslpassword, and any future *password
// setting, in either DSN form.
func isSecretKey(key string) bool {
	return strings.Contains(strings.ToLower(key), "password")
}

// redactDSN masks every password in dsn. A DSN it cannot parse is masked
// whole: guessing where its password ends could leak part of it.
func redactDSN(dsn string) string {
	if isURLDSN(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return redacted
		}
		q := u.Query()
		masked := false
		for k := range q {
			if isSecretKey(k) {
				q[k] = []string{redacted}
				masked = true
			}
		}
		if masked {
			u.RawQuery = q.Encode()
		}
		return u.Redacted()
	}
	pairs, err := parseKeyValueDSN(dsn)
	if err != nil {
		return redacted
	}
	var b strings.Builder
	last := 0
	for _, p := range pairs {
		if isSecretKey(p.key) {
			b.WriteString(dsn[last:p.valStart])
			b.WriteString(redacted)
			last = p.valEnd
		}
	}
	b.WriteString(dsn[last:])
	return b.String()
}
