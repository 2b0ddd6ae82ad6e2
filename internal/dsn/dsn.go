// Package dsn is the grammar of PostgreSQL connection strings as libpq reads them (postgres://
// URLs and key=value settings): ${VAR} expansion, syntax checks whose messages never quote a
// password, redaction for logs, scrubbing of library error text, and the one parse that turns a
// DSN into pgx pool settings. It never connects to anything.
package dsn

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode"
)

// Redacted replaces secrets in anything printed. It is the same mask
// net/url uses, so URL and key=value DSNs look alike in logs.
const Redacted = "xxxxx"

// Expand replaces every ${NAME} in s with lookupEnv(NAME), once: text
// coming from the environment is not expanded again. A '$' not followed by
// '{' is literal, so passwords containing '$' need no escaping. It returns
// the names that are unset (each once, in order of appearance) and whether
// a "${" does not start a well-formed ${NAME}; such a typo is reported
// rather than kept as literal text because it would otherwise surface later
// as a confusing connection failure. A nil lookupEnv treats every variable
// as unset.
func Expand(s string, lookupEnv func(string) (string, bool)) (out string, unset []string, malformed bool) {
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

// checkSyntax reports whether dsn is a postgres URL or a libpq key=value
// string. Its messages never quote the DSN: the DSN holds a password.
func checkSyntax(dsn string) error {
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

// Check reports whether dsn is a postgres URL or a libpq key=value string whose settings the
// router's driver accepts (sslmode, timeouts, pool settings, TLS files): a map that passes
// Check is never refused later when its pools are opened. Its messages never quote the DSN.
func Check(dsn string) error {
	if err := checkSyntax(dsn); err != nil {
		return err
	}
	if _, err := PoolConfig(dsn); err != nil {
		return fmt.Errorf("is refused by the PostgreSQL driver: %w", err)
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
			return nil, fmt.Errorf("%s is not followed by '='", settingName(key, len(pairs)+1))
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
				return nil, fmt.Errorf("the quoted value of %s has no closing quote", settingName(key, len(pairs)+1))
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

// settingName names the n-th setting of a key=value DSN for an error
// message. The word is quoted only when it is a keyword libpq or pgx knows:
// in a malformed DSN, what sits where a keyword should be may be a piece of
// a password (password=two words, or a password pasted as the whole DSN).
func settingName(key string, n int) string {
	if isKeyword(key) {
		return fmt.Sprintf("setting %d (%q)", n, key)
	}
	return fmt.Sprintf("setting %d", n)
}

// isKeyword reports whether word is a connection setting libpq or pgx knows, in any case.
func isKeyword(word string) bool {
	_, known := dsnKeywords[strings.ToLower(word)]
	return known
}

// dsnKeywords are the connection settings of libpq (PostgreSQL 15-17) and
// the pool settings pgxpool reads from a DSN.
var dsnKeywords = func() map[string]struct{} {
	m := map[string]struct{}{}
	for _, k := range strings.Fields(`host hostaddr port dbname user password passfile
		require_auth channel_binding connect_timeout client_encoding options
		application_name fallback_application_name keepalives keepalives_idle
		keepalives_interval keepalives_count tcp_user_timeout replication
		gssencmode sslmode requiressl sslcompression sslcert sslkey sslpassword
		sslcertmode sslrootcert sslcrl sslcrldir sslsni sslnegotiation requirepeer
		ssl_min_protocol_version ssl_max_protocol_version krbsrvname gsslib
		gssdelegation service target_session_attrs load_balance_hosts
		pool_max_conns pool_min_conns pool_min_idle_conns pool_max_conn_lifetime
		pool_max_conn_lifetime_jitter pool_max_conn_idle_time
		pool_health_check_period default_query_exec_mode statement_cache_capacity
		description_cache_capacity min_read_buffer_size`) {
		m[k] = struct{}{}
	}
	return m
}()

// isBlank matches C isspace in the "C" locale, which libpq uses.
func isBlank(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// isSecretKey matches password and sslpassword, and any future *password
// setting, in either DSN form.
func isSecretKey(key string) bool {
	return strings.Contains(strings.ToLower(key), "password")
}

// libpqURLPassword returns the password of a postgres:// URL as libpq and pgx find it, still
// percent-encoded: after the first ':' of what precedes the first '@', when that '@' comes
// before any '/'.
func libpqURLPassword(dsn string) string {
	_, rest, _ := strings.Cut(dsn, "://")
	i := strings.IndexAny(rest, "@/")
	if i < 0 || rest[i] != '@' {
		return ""
	}
	_, pw, _ := strings.Cut(rest[:i], ":")
	return pw
}

// Secrets lists every password in dsn in each form it may be printed
// in, longest first so that scrubbing a longer form is not defeated by a
// shorter one replaced inside it first. A DSN that does not parse has no
// known boundaries, so the whole DSN and each blank-separated word of it
// are listed instead.
func Secrets(dsn string) []string {
	var vals []string
	if isURLDSN(dsn) {
		// The password as the driver reads it (libpq's grammar: the user info runs to the first
		// '@' before any '/', across a '?' or '#' that net/url would stop at).
		if pw := libpqURLPassword(dsn); pw != "" {
			vals = append(vals, pw)
			if v, err := url.PathUnescape(pw); err == nil {
				vals = append(vals, v)
			}
		}
		u, err := url.Parse(dsn)
		// url.Parse takes blanks in a path, which the driver refuses and quotes from mid-string.
		if err != nil || strings.ContainsFunc(dsn, unicode.IsSpace) {
			return longestFirst(append(vals, unparsed(dsn)...))
		}
		if pw, ok := u.User.Password(); ok {
			vals = append(vals, pw, url.PathEscape(pw), url.QueryEscape(pw))
		}
		for _, kv := range strings.Split(u.RawQuery, "&") {
			k, raw, found := strings.Cut(kv, "=")
			if !found {
				// The driver refuses a parameter without '=' and quotes it whole; it may hold a
				// DSN of its own (a ${VAR} expanded into the query), so read it as one.
				vals = append(vals, Secrets(kv)...)
				continue
			}
			if key, err := url.QueryUnescape(k); err == nil && isSecretKey(key) {
				vals = append(vals, raw)
				if v, err := url.QueryUnescape(raw); err == nil {
					vals = append(vals, v)
				}
			}
		}
	} else {
		pairs, err := parseKeyValueDSN(dsn)
		if err != nil {
			return unparsed(dsn)
		}
		for _, p := range pairs {
			if isSecretKey(p.key) {
				raw := dsn[p.valStart:p.valEnd]
				vals = append(vals, raw, unquoteValue(raw), strings.Trim(raw, "'"))
			}
		}
	}
	return longestFirst(vals)
}

// longestFirst sorts vals longest first, without repeats: the order in which Scrub replaces them.
func longestFirst(vals []string) []string {
	slices.SortFunc(vals, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	return slices.Compact(vals)
}

// unparsed is Secrets of a DSN that does not parse: the whole DSN, each blank-separated word,
// and the passwords of each word read as a DSN of its own (a library may quote any part of the
// text, from mid-word), longest first.
func unparsed(dsn string) []string {
	words := strings.Fields(dsn)
	vals := append([]string{dsn}, words...)
	for _, w := range words {
		if w != dsn {
			vals = append(vals, Secrets(w)...)
		}
	}
	return longestFirst(vals)
}

// unquoteValue undoes libpq's quoting of a key=value setting: the
// surrounding single quotes and the backslash escapes.
func unquoteValue(raw string) string {
	raw = strings.TrimSuffix(strings.TrimPrefix(raw, "'"), "'")
	var b strings.Builder
	for i := 0; i < len(raw); i++ {
		if raw[i] == '\\' && i+1 < len(raw) {
			i++
		}
		b.WriteByte(raw[i])
	}
	return b.String()
}

// Redact masks every password in dsn. A DSN it cannot parse is masked
// whole: guessing where its password ends could leak part of it.
func Redact(dsn string) string {
	if isURLDSN(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return Redacted
		}
		q := u.Query()
		masked := false
		for k := range q {
			if isSecretKey(k) {
				q[k] = []string{Redacted}
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
		return Redacted
	}
	var b strings.Builder
	last := 0
	for _, p := range pairs {
		if isSecretKey(p.key) {
			b.WriteString(dsn[last:p.valStart])
			b.WriteString(Redacted)
			last = p.valEnd
		}
	}
	b.WriteString(dsn[last:])
	return b.String()
}
