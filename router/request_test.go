package router

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/shardgate/shardgate/shardmap"
)

func TestDecodeTransfer(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       TransferInput
		err        string // substring; empty means success
	}{
		{"minimal", `{"src": 8842, "dst": 1190, "amount": 2500}`, TransferInput{Src: 8842, Dst: 1190, Amount: 2500, Currency: "EUR"}, ""},
		{"all fields", `{"src":1,"dst":2,"amount":3,"currency":"USD","reference":"inv 7"}`, TransferInput{Src: 1, Dst: 2, Amount: 3, Currency: "USD", Reference: "inv 7"}, ""},
		{"negative accounts", `{"src":-1,"dst":-2,"amount":3}`, TransferInput{Src: -1, Dst: -2, Amount: 3, Currency: "EUR"}, ""},
		{"max int64", `{"src":9223372036854775807,"dst":2,"amount":9223372036854775807}`, TransferInput{Src: 9223372036854775807, Dst: 2, Amount: 9223372036854775807, Currency: "EUR"}, ""},
		{"140 chars reference", `{"src":1,"dst":2,"amount":3,"reference":"` + strings.Repeat("ü", 140) + `"}`, TransferInput{Src: 1, Dst: 2, Amount: 3, Currency: "EUR", Reference: strings.Repeat("ü", 140)}, ""},
		{"empty", ``, TransferInput{}, "not JSON"},
		{"array", `[1]`, TransferInput{}, "must be a JSON object"},
		{"truncated", `{"src":1`, TransferInput{}, "not JSON"},
		{"trailing data", `{"src":1,"dst":2,"amount":3} {}`, TransferInput{}, "unexpected data"},
		{"unknown field", `{"src":1,"dst":2,"amount":3,"x":1}`, TransferInput{}, `unknown field "x"`},
		{"duplicate field", `{"src":1,"src":5,"dst":2,"amount":3}`, TransferInput{}, `"src" appears twice`},
		{"missing amount", `{"src":1,"dst":2}`, TransferInput{}, `"amount" is required`},
		{"string number", `{"src":"1","dst":2,"amount":3}`, TransferInput{}, `"src" must be an integer, got a string`},
		{"null", `{"src":null,"dst":2,"amount":3}`, TransferInput{}, "got null"},
		{"float", `{"src":1,"dst":2,"amount":2.5}`, TransferInput{}, "must be an integer"},
		{"exponent", `{"src":1,"dst":2,"amount":1e3}`, TransferInput{}, "must be an integer"},
		{"overflow", `{"src":9223372036854775808,"dst":2,"amount":3}`, TransferInput{}, "between"},
		{"object value", `{"src":{},"dst":2,"amount":3}`, TransferInput{}, "got an object"},
		{"zero amount", `{"src":1,"dst":2,"amount":0}`, TransferInput{}, "positive"},
		{"negative amount", `{"src":1,"dst":2,"amount":-5}`, TransferInput{}, "positive"},
		{"same accounts", `{"src":1,"dst":1,"amount":5}`, TransferInput{}, "must differ"},
		{"lower-case currency", `{"src":1,"dst":2,"amount":3,"currency":"eur"}`, TransferInput{}, "ISO 4217"},
		{"long reference", `{"src":1,"dst":2,"amount":3,"reference":"` + strings.Repeat("x", 141) + `"}`, TransferInput{}, "at most 140"},
		{"control in reference", `{"src":1,"dst":2,"amount":3,"reference":"a\u0000b"}`, TransferInput{}, "control characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeTransfer([]byte(tc.body), "EUR")
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errBadBody) {
				t.Fatalf("error %v, want one containing %q wrapping errBadBody", err, tc.err)
			}
		})
	}
}

func TestFingerprintIgnoresFormatting(t *testing.T) {
	parse := func(body string) TransferInput {
		in, err := DecodeTransfer([]byte(body), "EUR")
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	a := Fingerprint("POST", "/transfers", parse(`{"src": 8842, "dst": 1190, "amount": 2500}`))
	same := []string{
		`{"amount":2500,"dst":1190,"src":8842}`,
		"{\n\t\"dst\" : 1190 ,\"src\":8842,\"amount\":2500, \"currency\":\"EUR\"}",
		`{"src":8842,"dst":1190,"amount":2500,"reference":""}`,
	}
	for _, b := range same {
		if got := Fingerprint("POST", "/transfers", parse(b)); got != a {
			t.Errorf("%s: fingerprint differs", b)
		}
	}
	different := []string{
		`{"src":8842,"dst":1190,"amount":2501}`,
		`{"src":8842,"dst":1191,"amount":2500}`,
		`{"src":8843,"dst":1190,"amount":2500}`,
		`{"src":8842,"dst":1190,"amount":2500,"currency":"USD"}`,
		`{"src":8842,"dst":1190,"amount":2500,"reference":"r"}`,
	}
	for _, b := range different {
		if got := Fingerprint("POST", "/transfers", parse(b)); got == a {
			t.Errorf("%s: same fingerprint as a different request", b)
		}
	}
	if Fingerprint("POST", "/other", parse(same[0])) == a {
		t.Error("path is not part of the fingerprint")
	}
	if len(a) != 64 {
		t.Errorf("fingerprint %q is not 64 hex digits", a)
	}
}

func TestParseIdempotencyKey(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"9f1c2d64-0a1e-4f7c-9d2b-3d8e5c1a77f0", "9f1c2d64-0a1e-4f7c-9d2b-3d8e5c1a77f0", ""},
		{`"9f1c2d64-0a1e-4f7c-9d2b-3d8e5c1a77f0"`, "9f1c2d64-0a1e-4f7c-9d2b-3d8e5c1a77f0", ""},
		{"  abc\t", "abc", ""},
		{`"a\"b\\c"`, `a"b\c`, ""},
		{`ab"c`, `ab"c`, ""},
		{strings.Repeat("k", 255), strings.Repeat("k", 255), ""},
		{"", "", "empty"},
		{`""`, "", "empty"},
		{strings.Repeat("k", 256), "", "at most 255"},
		{`"abc`, "", "closing quote"},
		{`"abc"x`, "", "only parameters"},
		// RFC 8941 parameters on the sf-string are parsed strictly, then ignored.
		{`"abc";x=1`, "abc", ""},
		{`"abc";x`, "abc", ""},
		{`"abc";*x=1`, "abc", ""},
		{`"abc";a_b-c.d*9=1`, "abc", ""},
		{`"abc";x=1;x=2`, "abc", ""},
		{`"abc";  x=1`, "abc", ""},
		{`"abc";i=-123456789012345;d=-123456789012.123;e=0.5;s="q\"s;x=1";t=tok:en/1*!;u=*;b=:aGVsbG8=:;c=:aGk:;f=?0;g=?1`, "abc", ""},
		{`"abc";x=1 `, "abc", ""},
		{`abc;x=1`, "abc;x=1", ""}, // the bare form has no parameters
		{`"abc";`, "", "parameter name"},
		{`"abc";X=1`, "", "parameter name"},
		{`"abc";1x=1`, "", "parameter name"},
		{`"abc";-x=1`, "", "parameter name"},
		{`"abc";x=1;`, "", "parameter name"},
		{`"abc" ;x=1`, "", "only parameters"},
		{`"abc";x =1`, "", "only parameters"},
		{`"abc";x=1 ;y`, "", "only parameters"},
		{`"abc";x=1,y`, "", "only parameters"},
		{`"abc";x=`, "", `parameter "x"`},
		{`"abc";x= 1`, "", `parameter "x"`},
		{`"abc";x=1.`, "", `parameter "x"`},
		{`"abc";x=1.2345`, "", `parameter "x"`},
		{`"abc";x=1234567890123456`, "", `parameter "x"`},
		{`"abc";x=1234567890123.5`, "", `parameter "x"`},
		{`"abc";x=-`, "", `parameter "x"`},
		{`"abc";x="open`, "", `parameter "x"`},
		{`"abc";x="a\b"`, "", `parameter "x"`},
		{"\"abc\";x=\"\x01\"", "", `parameter "x"`},
		{`"abc";x=?2`, "", `parameter "x"`},
		{`"abc";x=?`, "", `parameter "x"`},
		{`"abc";x=:a*b:`, "", `parameter "x"`},
		{`"abc";x=:aGk`, "", `parameter "x"`},
		{`"abc";x=:a:`, "", `parameter "x"`},
		{"\"abc\";x=:aG\nk:", "", `parameter "x"`},
		{`"abc";x=@`, "", `parameter "x"`},
		{`"abc";x=t@k`, "", "only parameters"},
		{`"abc";` + strings.Repeat("y", 1000) + `=@`, "", `parameter "` + strings.Repeat("y", 64) + `"… (1000 characters)`},
		{`"a\x"`, "", "backslash"},
		{`"a b"`, "", "not visible ASCII"},
		{"a b", "", "not visible ASCII"},
		{"clé", "", "not visible ASCII"},
		{"a\x7f", "", "not visible ASCII"},
	} {
		got, err := ParseIdempotencyKey(tc.in)
		if tc.err == "" {
			if err != nil || got != tc.want {
				t.Errorf("%q: got %q, %v; want %q", tc.in, got, err, tc.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errBadKey) {
			t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.err)
		}
	}
}

func TestTransferIDRoutesToTheSourceKeyspace(t *testing.T) {
	ks := shardmap.KeyspaceID(8842)
	id := TransferID(ks, "payments-api:transfer", "k1")
	// Ids are stored in ledgers and outboxes: the format never changes.
	if want := "1d65d16c18855fc7a3d732490611b97184ed004c3801f10c"; id != want {
		t.Fatalf("id %q, want %q: the keyspace id's 16 hex digits, then the first half of sha256(scope \\n key)", id, want)
	}
	long := strings.Repeat("k", 300) // past TransferID's stack buffer
	h := sha256.Sum256([]byte("payments-api:transfer\n" + long))
	if got, want := TransferID(ks, "payments-api:transfer", long), fmt.Sprintf("%016x%x", ks, h[:16]); got != want {
		t.Errorf("id of a long key %q, want %q", got, want)
	}
	got, ok := parseTransferID(id)
	if !ok || got != ks {
		t.Fatalf("parseTransferID(%q) = %x, %v", id, got, ok)
	}
	if TransferID(ks, "payments-api:transfer", "k1") != id {
		t.Error("TransferID is not deterministic")
	}
	if TransferID(ks, "other-client:transfer", "k1") == id || TransferID(ks, "payments-api:transfer", "k2") == id {
		t.Error("different scope or key gave the same id")
	}
	for _, bad := range []string{"", id[:47], id + "0", strings.ToUpper(id), "zz" + id[2:]} {
		if _, ok := parseTransferID(bad); ok {
			t.Errorf("parseTransferID(%q) accepted", bad)
		}
	}
}

// Client text in an error detail is quoted up to 64 characters, then cut with "…" and its full
// length: a 15,000-character field name must not make a 15 KB answer.
func TestDetailsQuoteClientTextBounded(t *testing.T) {
	long := strings.Repeat("é", 14990) + "tail"
	digits := "1" + strings.Repeat("0", 14999)
	for _, tc := range []struct{ name, body, want string }{
		{"unknown field", `{"` + long + `":1}`, `unknown field "` + strings.Repeat("é", 64) + `"… (14994 characters)`},
		{"currency", `{"src":1,"dst":2,"amount":3,"currency":"` + long + `"}`, `currency "` + strings.Repeat("é", 64) + `"… (14994 characters)`},
		{"integer overflow", `{"src":` + digits + `,"dst":2,"amount":3}`, "got " + digits[:64] + "… (15000 characters)"},
		{"decimal", `{"src":1,"dst":2,"amount":` + digits + `.5}`, "got " + digits[:64] + "… (15002 characters)"},
		{"string for an integer", `{"src":[` + digits + `],"dst":2,"amount":3}`, "got an array"},
		{"number for a string", `{"src":1,"dst":2,"amount":3,"currency":` + digits + `}`, "got the number " + digits[:64] + "… (15000 characters)"},
		{"short text in full", `{"src":1,"dst":2,"amount":3,"currency":"eur"}`, `currency "eur" must`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeTransfer([]byte(tc.body), "EUR")
			if err == nil || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 400 {
				t.Fatalf("error %.500q (%d bytes), want one under 400 bytes containing %q", err, len(err.Error()), tc.want)
			}
		})
	}
}

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"abc", `"abc"`},
		{"a\"b\n", `"a\"b\n"`},
		{strings.Repeat("x", 64), `"` + strings.Repeat("x", 64) + `"`},
		{strings.Repeat("x", 65), `"` + strings.Repeat("x", 64) + `"… (65 characters)`},
		{strings.Repeat("€", 100), `"` + strings.Repeat("€", 64) + `"… (100 characters)`},
	} {
		if got := quote(tc.in); got != tc.want {
			t.Errorf("quote(%.80q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// encoding/json turns invalid UTF-8 and lone surrogate escapes into U+FFFD without a word, so
// two different bodies would decode, and fingerprint, the same: they are refused, naming the
// field. U+FFFD itself, sent as UTF-8 or as \ufffd, is a character like any other.
func TestDecodeTransferRefusesWhatJSONWouldReplace(t *testing.T) {
	const head = `{"src":1,"dst":2,"amount":3,`
	for _, tc := range []struct{ name, body, err string }{
		{"invalid byte in reference", head + "\"reference\":\"a\xffb\"}", `field "reference" is not valid UTF-8`},
		{"UTF-8 encoded surrogate", head + "\"reference\":\"\xed\xa0\x80\"}", `field "reference" is not valid UTF-8`},
		{"overlong encoding", head + "\"reference\":\"\xc0\xaf\"}", `field "reference" is not valid UTF-8`},
		{"truncated sequence", head + "\"reference\":\"\xe2\x82\"}", `field "reference" is not valid UTF-8`},
		{"lone high surrogate", head + `"reference":"\ud800"}`, `field "reference" contains \ud800`},
		{"lone low surrogate", head + `"reference":"x\uDC00y"}`, `field "reference" contains \uDC00`},
		{"high then text", head + `"reference":"\ud83dx"}`, `field "reference" contains \ud83d`},
		{"high then non-low escape", head + `"reference":"\ud83d\u0041"}`, `field "reference" contains \ud83d`},
		{"two highs", head + `"reference":"\ud83d\ud83d\ude00"}`, `field "reference" contains \ud83d`},
		{"low then high", head + `"reference":"\ude00\ud83d"}`, `field "reference" contains \ude00`},
		{"invalid currency", head + "\"currency\":\"E\xffR\"}", `field "currency" is not valid UTF-8`},
		{"surrogate currency", head + `"currency":"\udead"}`, `field "currency" contains \udead`},
		{"invalid field name", "{\"sr\xffc\":1}", "field name \"sr\uFFFDc\" is not valid UTF-8"},
		{"surrogate field name", `{"src\ud800":1}`, "field name \"src\uFFFD\" contains \\ud800"},
		{"invalid byte in an integer field", "{\"src\":\"\xff\"}", `field "src" is not valid UTF-8`},
		{"invalid top level string", "\"\xff\"", "the body is not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeTransfer([]byte(tc.body), "EUR")
			if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, errBadBody) {
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
	for _, tc := range []struct{ name, body, reference string }{
		{"U+FFFD as UTF-8", head + "\"reference\":\"a\xef\xbf\xbdb\"}", "a\uFFFDb"},
		{"U+FFFD escaped", head + `"reference":"a\ufffdb"}`, "a\uFFFDb"},
		{"U+FFFD escaped upper case", head + `"reference":"\uFFFD"}`, "\uFFFD"},
		{"surrogate pair", head + `"reference":"\ud83d\ude00"}`, "😀"},
		{"surrogate pair upper case", head + `"reference":"\uD83D\uDE00!"}`, "😀!"},
		{"astral as UTF-8", head + `"reference":"😀"}`, "😀"},
		{"escaped backslash before u", head + `"reference":"\\ud800"}`, `\ud800`},
		{"escaped quote", head + `"reference":"\"\ud83d\ude00\""}`, `"😀"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, err := DecodeTransfer([]byte(tc.body), "EUR")
			if err != nil || in.Reference != tc.reference {
				t.Fatalf("got %q, %v; want %q", in.Reference, err, tc.reference)
			}
		})
	}
}
