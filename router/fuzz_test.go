package router

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzDecodeTransfer: any body either decodes to a valid transfer or is a client error; an
// accepted body is valid UTF-8 and its strings hold no U+FFFD that it did not send; a decoded
// transfer decodes to the same value after canonical re-encoding.
func FuzzDecodeTransfer(f *testing.F) {
	for _, s := range []string{
		`{"src": 8842, "dst": 1190, "amount": 2500}`,
		`{"src":1,"dst":2,"amount":3,"currency":"USD","reference":"inv"}`,
		`{"src":1,"src":2}`, `[]`, `{"amount":1e3}`, `{"src":-9223372036854775808,"dst":0,"amount":1}`, "\xff",
		`{"src":1,"dst":2,"amount":3,"reference":"\ud83d\ude00\ufffd"}`, `{"src":1,"dst":2,"amount":3,"reference":"\ud800"}`,
		"{\"src\":1,\"dst\":2,\"amount\":3,\"reference\":\"\xef\xbf\xbd\xed\xa0\x80\"}",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		in, err := DecodeTransfer([]byte(body), "EUR")
		if err != nil {
			if !errors.Is(err, errBadBody) {
				t.Fatalf("error not marked as the client's: %v", err)
			}
			return
		}
		if in.Amount <= 0 || in.Src == in.Dst || !isCurrencyCode(in.Currency) {
			t.Fatalf("accepted an invalid transfer %+v", in)
		}
		if !utf8.ValidString(body) {
			t.Fatalf("accepted a body that is not UTF-8: %q", body)
		}
		if n := strings.Count(in.Reference, "\uFFFD"); n > strings.Count(body, "\uFFFD")+strings.Count(strings.ToLower(body), `\ufffd`) {
			t.Fatalf("reference %q holds U+FFFD that %q did not send", in.Reference, body)
		}
		canonical, _ := json.Marshal(in)
		re, err := DecodeTransfer(canonical, "EUR")
		if err != nil || re != in || Fingerprint("POST", "/transfers", re) != Fingerprint("POST", "/transfers", in) {
			t.Fatalf("canonical form of %+v does not decode back: %+v, %v", in, re, err)
		}
	})
}

// FuzzParseIdempotencyKey: a parsed key is always 1-255 visible ASCII characters, and its
// quoted form parses back to it.
func FuzzParseIdempotencyKey(f *testing.F) {
	for _, s := range []string{"9f1c2d64-0a1e-4f7c-9d2b-3d8e5c1a77f0", `"abc"`, `"a\"b"`, `"`, "", " x ", "a\x00",
		`"abc";x=1`, `"abc";a;b=?0;c="s";d=-1.5;e=:aGk=:;f=tok/1`, `"abc";X`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		key, err := ParseIdempotencyKey(header)
		if err != nil {
			if !errors.Is(err, errBadKey) {
				t.Fatalf("error not marked as a bad key: %v", err)
			}
			return
		}
		if len(key) < 1 || len(key) > maxKeyLen {
			t.Fatalf("accepted key of length %d", len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x21 || key[i] > 0x7e {
				t.Fatalf("accepted byte %#x", key[i])
			}
		}
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		for _, form := range []string{quoted, quoted + ";x", quoted + `;a=1;b="p"`} {
			if k, err := ParseIdempotencyKey(form); err != nil || k != key {
				t.Fatalf("quoted form %q parsed to %q, %v", form, k, err)
			}
		}
	})
}

// FuzzPostTransfer drives the whole handler with requests that fail validation before any
// shard is touched: every answer must be a 4xx problem, never a panic or a 5xx.
func FuzzPostTransfer(f *testing.F) {
	f.Add("k1", "application/json", `{"src":1,"dst":1,"amount":1}`)
	f.Add("", "application/json", `{"src":1,"dst":2,"amount":3}`)
	f.Add(`"unterminated`, "", `{}`)
	f.Add("k", "text/plain", `x`)
	f.Add("k", "application/json; charset=utf-8", strings.Repeat("[", 5000))
	srv := offlineServer(f, "auth:\n  mode: none\ntransfers:\n  max_body_bytes: 1024\n")
	f.Fuzz(func(t *testing.T, key, contentType, body string) {
		if _, err := ParseIdempotencyKey(key); err == nil {
			if _, err := DecodeTransfer([]byte(body), "EUR"); err == nil && len(body) <= 1024 {
				return // a valid request would go on to the (absent) shard: not this target's concern
			}
		}
		req := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", contentType)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		if rec.Code < 400 || rec.Code > 499 || rec.Header().Get("Content-Type") != "application/problem+json" {
			t.Fatalf("key %q type %q body %q: %d %s", key, contentType, body, rec.Code, rec.Body)
		}
	})
}
