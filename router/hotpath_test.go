package router

import (
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardgate/shardgate/config"
	"github.com/shardgate/shardgate/shardmap"
	"github.com/shardgate/shardgate/topology"
)

// TestFingerprintGolden pins fingerprints computed by the original json.Marshal-based code:
// shards store them, so a faster encoding must not change a single one.
func TestFingerprintGolden(t *testing.T) {
	for _, tc := range []struct {
		in   TransferInput
		want string
	}{
		{TransferInput{Src: 8842, Dst: 1190, Amount: 2500, Currency: "EUR"}, "7f25b751d6d4c087d5a2642af118e22119f327d4ed6a47d5c51f154efef79b75"},
		{TransferInput{Src: 123456, Dst: 123457, Amount: 4242, Currency: "USD", Reference: "invoice 2024-0042"}, "f46851bfca19db9093f27837b4854ba831696d6631558cdd814c43288ad92a2c"},
		{TransferInput{Src: -9223372036854775808, Dst: 9223372036854775807, Amount: 1, Currency: "JPY", Reference: "<a&b> \"q\" \\ \u2028\u2029 ü 😀 \x7f é"},
			"f7ebec05f066e3dbd44c9ac995384f94bc9156139e43a534913ad8473937c444"},
	} {
		if got := Fingerprint("POST", "/transfers", tc.in); got != tc.want {
			t.Errorf("Fingerprint(%+v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// encodingCases are transfers whose strings exercise every escape encoding/json makes.
var encodingCases = []TransferInput{
	{Src: 8842, Dst: 1190, Amount: 2500, Currency: "EUR"},
	{Src: -9223372036854775808, Dst: 9223372036854775807, Amount: 0, Currency: "", Reference: "x"},
	{Src: 1, Dst: 2, Amount: 3, Currency: "USD", Reference: "invoice 2024-0042 ~!@#$%^*()_+-=[]{}|;':,./?"},
	{Src: 1, Dst: 2, Amount: 3, Currency: "a\"b", Reference: `back\slash "quoted"`},
	{Src: 1, Dst: 2, Amount: 3, Currency: "<&>", Reference: "<script>&amp;</script>"},
	{Src: 1, Dst: 2, Amount: 3, Currency: "EUR", Reference: "line\nsep\u2028para\u2029tab\t\x00\x1f\x7f"},
	{Src: 1, Dst: 2, Amount: 3, Currency: "EUR", Reference: "ü é 😀 \ufffd"},
	{Src: 1, Dst: 2, Amount: 3, Currency: "\xff", Reference: "bad \xed\xa0\x80 utf-8 \xc3"},
}

// TestTransferBodyIsJSON: the stored 201 body is exactly json.Marshal of the transfer's view
// and a newline, as it was when encoding/json wrote it.
func TestTransferBodyIsJSON(t *testing.T) {
	s := offlineServer(t, offlineYAML)
	r := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(""))
	for _, in := range encodingCases {
		req := s.buildRequest(r, admitted{client: "c", key: "k", in: in})
		want, err := json.Marshal(transferView{ID: req.TransferID, Src: in.Src, Dst: in.Dst, Amount: in.Amount, Currency: in.Currency, Reference: in.Reference})
		if err != nil {
			t.Fatal(err)
		}
		if req.Response.Body != string(want)+"\n" {
			t.Errorf("body of %+v:\n got %q\nwant %q", in, req.Response.Body, string(want)+"\n")
		}
	}
}

// offlineYAML configures an offline server as the benchmarks measure it: no authentication,
// the replay cache on (by default).
const offlineYAML = "auth:\n  mode: none\n"

// offlineServer is a server configured by routerYAML over one shard that is never dialled: for
// what the router does before, or instead of, a shard's round trip.
func offlineServer(tb testing.TB, routerYAML string) *Server {
	tb.Helper()
	cfg, err := config.Parse("router.yaml", []byte(routerYAML))
	if err != nil {
		tb.Fatal(err)
	}
	m, err := shardmap.Parse("shardmap.yaml", []byte("version: 1\nshards:\n  - name: s\n    dsn: postgres://u@127.0.0.1:1/db\n    ranges: [\"-\"]\n"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	topo, err := topology.Open(m, nil, cfg.ShardPool)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(topo.Close)
	return New(cfg, topo, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
}

// FuzzTransferEncoding: the hand-built encodings are byte for byte what encoding/json writes,
// whatever the strings hold.
func FuzzTransferEncoding(f *testing.F) {
	for _, in := range encodingCases {
		f.Add("1d65d16c18855fc7", in.Src, in.Dst, in.Amount, in.Currency, in.Reference)
	}
	f.Add("<id>\u2028", int64(0), int64(-1), int64(1), "", "")
	f.Fuzz(func(t *testing.T, id string, src, dst, amount int64, currency, reference string) {
		in := TransferInput{Src: src, Dst: dst, Amount: amount, Currency: currency, Reference: reference}
		want, _ := json.Marshal(in)
		if got := append(appendTransferFields([]byte{'{'}, in), '}'); string(got) != string(want) {
			t.Fatalf("canonical encoding of %+v:\n got %q\nwant %q", in, got, want)
		}
		view, _ := json.Marshal(transferView{ID: id, Src: src, Dst: dst, Amount: amount, Currency: currency, Reference: reference})
		if got := transferBody(id, in); got != string(view)+"\n" {
			t.Fatalf("body of %q %+v:\n got %q\nwant %q", id, in, got, string(view)+"\n")
		}
	})
}

// scanSeeds are bodies around the edges of what scanPlainTransfer reads.
var scanSeeds = []string{
	benchBodyPlain, benchBodyFull,
	`{"src":1,"dst":2,"amount":3}`, " \t\r\n{ \"amount\" : 3 ,\"dst\":2, \"src\":1 } \n",
	`{"src":-0,"dst":0,"amount":9223372036854775807,"currency":"EUR"}`,
	`{"src":-9223372036854775808,"dst":9223372036854775808,"amount":1}`,
	`{"src":01,"dst":2,"amount":3}`, `{"src":1.0,"dst":2,"amount":3e0}`, `{"src":-,"dst":2,"amount":3}`,
	`{"src":1,"dst":2,"amount":3,"reference":"ü é 😀"}`, "{\"src\":1,\"dst\":2,\"amount\":3,\"reference\":\"\xed\xa0\x80\xff\"}",
	`{"src":1,"dst":2,"amount":3,"reference":"a\"b"}`, `{"src":1,"dst":2,"amount":3,"reference":"\u00fc"}`,
	`{"src":1,"src":1,"dst":2,"amount":3}`, `{"src":1,"dst":2}`, `{"src":1,"dst":2,"amount":3,}`, `{}`,
	`{"src":1,"dst":2,"amount":3} {}`, `{"src":1,"dst":2,"amount":3,"currency":null}`, `{"src":"1","dst":2,"amount":3}`,
	`{"src":1,"dst":2,"amount":3,"Currency":"USD"}`, `{"src":1,"dst":2,"amount":3,"x":[1,{"y":true}]}`,
}

// checkPlainScan fails t unless decodeFields accepts whatever scanPlainTransfer accepts, with
// the same result.
func checkPlainScan(t *testing.T, body []byte) bool {
	t.Helper()
	in, hasCurrency, ok := scanPlainTransfer(body)
	if !ok {
		return false
	}
	want, seen, err := decodeFields(body)
	if err != nil || in != want || hasCurrency != seen["currency"] {
		t.Fatalf("%q: scanned %+v (currency %v), decoded %+v (currency %v), %v", body, in, hasCurrency, want, seen["currency"], err)
	}
	return true
}

// FuzzScanPlainTransfer: the fast path of DecodeTransfer never accepts what the decoder would
// refuse or read differently.
func FuzzScanPlainTransfer(f *testing.F) {
	for _, s := range scanSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) { checkPlainScan(t, []byte(body)) })
}

// TestScanPlainTransferAgreesWithDecoder runs FuzzScanPlainTransfer's check over random
// mutations of its seeds on every test run, and checks that the bodies clients send do take the
// fast path.
func TestScanPlainTransferAgreesWithDecoder(t *testing.T) {
	for _, body := range []string{benchBodyPlain, benchBodyFull, `{"src":1,"dst":2,"amount":3,"reference":"ü"}`} {
		if _, _, ok := scanPlainTransfer([]byte(body)); !ok {
			t.Errorf("%s does not take the fast path", body)
		}
	}
	const alphabet = "{}[]\":,-+.eE0123456789 \t\r\n\\uabcdnrstl\x00\x1f\x7f\x80\xc3\xbc\xed\xff"
	rng := rand.New(rand.NewPCG(11, 4))
	accepted := 0
	for _, seed := range scanSeeds {
		for range 3000 {
			b := []byte(seed)
			for range 1 + rng.IntN(3) {
				i := rng.IntN(len(b) + 1)
				c := alphabet[rng.IntN(len(alphabet))]
				switch rng.IntN(3) {
				case 0:
					b = slices.Insert(b, i, c)
				case 1:
					if i < len(b) {
						b = slices.Delete(b, i, i+1)
					}
				default:
					if i < len(b) {
						b[i] = c
					}
				}
			}
			if checkPlainScan(t, b) {
				accepted++
			}
		}
	}
	t.Logf("%d mutants took the fast path", accepted)
}

// FuzzProblemBody: a problem's body is byte for byte json.Marshal of its problem and a newline.
func FuzzProblemBody(f *testing.F) {
	for _, detail := range []string{"", "send an Idempotency-Key header", `field "s<r>c" & "\u2028"`, "\xff\x00é"} {
		f.Add("idempotency-key-reused", "The Idempotency-Key was used for a different request", 422, detail)
	}
	f.Fuzz(func(t *testing.T, slug, title string, status int, detail string) {
		want, _ := json.Marshal(problem{Type: ProblemBase + slug, Title: title, Status: status, Detail: detail})
		if got := appendProblem(nil, problemType{slug, status, title}, detail); string(got) != string(want)+"\n" {
			t.Fatalf("got %q, want %q", got, string(want)+"\n")
		}
	})
}
