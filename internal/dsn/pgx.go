package dsn

import (
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PoolConfig parses dsn with pgxpool, the parser every shard connection is opened with, so
// validation and connection can never disagree. Its error never quotes the DSN: pgx's own
// message embeds it with a best-effort redaction that misses spellings libpq accepts (an
// escaped blank in password=a\ b leaves "b" printed), so only pgx's reason is kept, scrubbed
// of every spelling of the DSN's passwords.
func PoolConfig(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, parseError(dsn, err)
	}
	return cfg, nil
}

// parseError keeps what pgx says was wrong and drops the connection string it quotes:
// "cannot parse `<dsn>`: <reason> (<cause>)" becomes "<reason> (<cause>)". The reason is then
// scrubbed of every spelling of the DSN's passwords, and whatever else it quotes or copies of the
// DSN is dropped (see dropQuoted and dropCopied): a driver echoes the piece it refuses, and that
// piece can hold a password in a spelling that Secrets cannot foresee (pgx reads a URL as libpq
// does, where '#' starts no fragment, so a shard's DSN expanded after a '#' is quoted whole, and
// it quotes with "%s", so a '"' inside the piece ends the quote early).
func parseError(dsn string, err error) error {
	text := err.Error()
	if pce := (*pgconn.ParseConfigError)(nil); errors.As(err, &pce) {
		text = "the connection string cannot be parsed"
		if i := strings.LastIndex(err.Error(), "`: "); i >= 0 {
			text = err.Error()[i+3:]
		}
	}
	return errors.New(dropCopied(dsn, dropQuoted(Scrub(dsn, text))))
}

// quotedText matches a double-quoted string in a message, with or without Go's escapes.
var quotedText = regexp.MustCompile(`(?s)"(?:[^"\\]|\\.)*"`)

// dropQuoted replaces what a driver message quotes with "…", but a single character (a separator
// such as "=") or a connection keyword, so the message still says what was wrong and where.
func dropQuoted(text string) string {
	return quotedText.ReplaceAllStringFunc(text, func(q string) string {
		inner, err := strconv.Unquote(q)
		if err != nil {
			inner = q[1 : len(q)-1]
		}
		if isKeyword(inner) || utf8.RuneCountInString(inner) <= 1 {
			return q
		}
		return `"…"`
	})
}

// minCopied is the shortest run of a DSN's text that dropCopied drops from a message.
const minCopied = 4

// dropCopied replaces each run of minCopied or more characters that text copies from dsn with
// "…", but a run that is a connection keyword: a message about a refused DSN then names the
// setting, never its value, whatever the quoting.
func dropCopied(dsn, text string) string {
	var b strings.Builder
	for i := 0; i < len(text); {
		n := 0 // bytes of the longest run of whole runes at i that dsn holds
		for i+n < len(text) {
			_, size := utf8.DecodeRuneInString(text[i+n:])
			if !strings.Contains(dsn, text[i:i+n+size]) {
				break
			}
			n += size
		}
		run := text[i : i+n]
		switch {
		case utf8.RuneCountInString(run) >= minCopied && !isKeywordRun(run):
			b.WriteString("…")
		case n > 0:
			b.WriteString(run)
		default:
			_, n = utf8.DecodeRuneInString(text[i:])
			b.WriteString(text[i : i+n])
		}
		i += n
	}
	return b.String()
}

// isKeywordRun reports whether run is a connection keyword, with the blanks and punctuation
// around it.
func isKeywordRun(run string) bool {
	return isKeyword(strings.TrimFunc(run, func(r rune) bool { return r != '_' && !unicode.IsLetter(r) && !unicode.IsDigit(r) }))
}

// Scrub returns text with every password of dsn replaced by Redacted, in each spelling it can
// take there (see Secrets). Use it on error text a library built from the DSN.
func Scrub(dsn, text string) string {
	for _, v := range Secrets(dsn) {
		if v != "" {
			text = strings.ReplaceAll(text, v, Redacted)
		}
	}
	return text
}

// Setting returns the value of the setting key in dsn, and whether dsn sets it, in either DSN
// form. A DSN that does not parse sets nothing.
func Setting(dsn, key string) (string, bool) {
	if isURLDSN(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", false
		}
		q := u.Query()
		return q.Get(key), q.Has(key)
	}
	pairs, err := parseKeyValueDSN(dsn)
	if err != nil {
		return "", false
	}
	for _, p := range pairs {
		if p.key == key {
			return unquoteValue(dsn[p.valStart:p.valEnd]), true
		}
	}
	return "", false
}
