package dsn

import (
	"reflect"
	"strings"
	"testing"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestExpandVars(t *testing.T) {
	lookup := env("A", "1", "B_2", "two", "LOOP", "${A}")
	tests := []struct {
		in, out   string
		unset     []string
		malformed bool
	}{
		{"plain", "plain", nil, false},
		{"${A}-${B_2}", "1-two", nil, false},
		{"$A $ $$ {A} pa$s", "$A $ $$ {A} pa$s", nil, false},
		{"${LOOP}", "${A}", nil, false}, // expanded once, not recursively
		{"${X}${Y}${X}", "", []string{"X", "Y"}, false},
		{"${A", "${A", nil, true},
		{"${}", "${}", nil, true},
		{"${1A}x", "${1A}x", nil, true},
		{"${A-B}", "${A-B}", nil, true},
	}
	for _, tt := range tests {
		out, unset, malformed := Expand(tt.in, lookup)
		if out != tt.out || !reflect.DeepEqual(unset, tt.unset) || malformed != tt.malformed {
			t.Errorf("Expand(%q) = %q %v %v, want %q %v %v", tt.in, out, unset, malformed, tt.out, tt.unset, tt.malformed)
		}
	}
	if out, unset, _ := Expand("${A}", nil); out != "" || !reflect.DeepEqual(unset, []string{"A"}) {
		t.Errorf("nil lookupEnv: %q %v", out, unset)
	}
}

// TestCheckRefusesWhatTheDriverRefuses: a map that check accepts must open at load, so every
// setting the driver refuses is refused by Check, and the reason never quotes a password in any
// of its spellings (an escaped blank in a key=value password once left its tail printed).
func TestCheckRefusesWhatTheDriverRefuses(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{`host=h password=Leak\ Me995 sslmode=bogus`, "sslmode is invalid"},
		{`host=h password='Leak Me995' connect_timeout=abc`, "connect_timeout"},
		{`postgres://u:Leak%20Me995@h/db?sslmode=bogus`, "sslmode is invalid"},
		{`postgres://u:LeakMe995@h/db?pool_max_conns=zero`, "pool_max_conns"},
		{`host=h password=Leak\ Me995 pool_max_conns=0`, "pool_max_conns"},
	}
	for _, tt := range tests {
		err := Check(tt.dsn)
		if err == nil {
			t.Errorf("Check(%q) accepted it", tt.dsn)
			continue
		}
		if !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Check(%q) = %q, want it to say %q", tt.dsn, err, tt.want)
		}
		for _, secret := range []string{"Leak", "Me995", "%20"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("Check(%q) = %q leaks %q", tt.dsn, err, secret)
			}
		}
	}
	for _, ok := range []string{"host=h password=a\\ b sslmode=require connect_timeout=3", "postgres://u:p@h:5432/db?sslmode=disable&pool_max_conns=7"} {
		if err := Check(ok); err != nil {
			t.Errorf("Check(%q) = %v, want nil", ok, err)
		}
	}
}

func TestSetting(t *testing.T) {
	tests := []struct {
		dsn, key, want string
		set            bool
	}{
		{"host=h pool_max_conns=7", "pool_max_conns", "7", true},
		{"host=h pool_max_conns = '9'", "pool_max_conns", "9", true},
		{"host=h", "pool_max_conns", "", false},
		{"postgres://h/db?pool_max_conns=3", "pool_max_conns", "3", true},
		{"postgres://h/db", "pool_max_conns", "", false},
		{"host='unterminated", "host", "", false},
	}
	for _, tt := range tests {
		if got, set := Setting(tt.dsn, tt.key); got != tt.want || set != tt.set {
			t.Errorf("Setting(%q, %q) = %q %v, want %q %v", tt.dsn, tt.key, got, set, tt.want, tt.set)
		}
	}
}

// TestCheckNeverQuotesPassword covers DSNs that pass the syntax check but that pgx refuses: pgx
// quotes the DSN in its error, and its redaction misses libpq spellings such as blanks around
// '=' or an escaped quote.
func TestCheckNeverQuotesPassword(t *testing.T) {
	for _, dsn := range []string{
		`host=h password = s3cr3t port=notaport`,
		`host=h password='s3 cr3t' port=notaport`,
		`host=h password = 's3\'cr3t' sslmode=sometimes`,
		`postgres://u:s3cr3t@h:5432/db?sslmode=sometimes`,
		// A DSN expanded into another's query: a parameter without '=', quoted whole.
		`postgres://h/db?postgres://u:s3cr3t@h/db`,
		`postgres://h/db?sslmode=disable&postgres://u:s3cr3t@h/db`,
		// The same after a '#': net/url reads a fragment there, pgx (as libpq) a host and a query.
		`postgres://h#x?postgres://u:s3cr3t@h/db`,
		`postgres://h:5432#x?postgres://u:s3cr3t@h/db`,
		// pgx quotes with "%s": a '"' in the piece ends its quote early.
		`postgres://h/db?ab"postgres://u:s3cr3t@h/db`,
		`postgres://h/db?postgres://u:s3"cr3t@h/db`,
		// A value pgx prints unquoted.
		`postgres://h/db?target_session_attrs=postgres://u:s3cr3t@h/db`,
		`host=h target_session_attrs=postgres://u:s3cr3t@h/db`,
	} {
		err := Check(dsn)
		if err == nil {
			t.Errorf("Check(%q) accepted it", dsn)
		} else if msg := err.Error(); strings.Contains(msg, "s3") || strings.Contains(msg, "cr3t") {
			t.Errorf("Check(%q) = %q leaks the password", dsn, msg)
		}
	}
}
