package dsn

import (
	"errors"
	"net/url"
	"regexp"
	"strconv"
	"strings"
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
// "cannot parse `<dsn>`: <reason> (<cause>)" becomes "<reason> (<cause>)". What the reason
// quotes of the DSN is dropped too (see dropQuoted), and the rest scrubbed of every spelling of
// its passwords.
func parseError(dsn string, err error) error {
	text := err.Error()
	if pce := (*pgconn.ParseConfigError)(nil); errors.As(err, &pce) {
		text = "the connection string cannot be parsed"
		if i := strings.LastIndex(err.Error(), "`: "); i >= 0 {
			text = err.Error()[i+3:]
		}
	}
	return errors.New(Scrub(dsn, dropQuoted(text)))
}

// quotedText matches a double-quoted string in a message, Go escapes included.
var quotedText = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// dropQuoted replaces each piece of the DSN that a driver message quotes with "…". The driver
// quotes the piece it refuses (a query parameter, a port, a value), and that piece can hold a
// password in a spelling that Secrets, which reads the DSN as net/url and libpq's grammar do,
// cannot foresee: pgx reads a URL as libpq does, where '#' starts no fragment, so a DSN of
// another shard expanded after a '#' is quoted whole. A single character (a separator such as
// "=") and a connection keyword stay, so the message still says what was wrong and where.
func dropQuoted(text string) string {
	return quotedText.ReplaceAllStringFunc(text, func(q string) string {
		inner, err := strconv.Unquote(q)
		if err != nil {
			inner = q[1 : len(q)-1]
		}
		if _, keyword := dsnKeywords[strings.ToLower(inner)]; keyword || utf8.RuneCountInString(inner) <= 1 {
			return q
		}
		return `"…"`
	})
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
