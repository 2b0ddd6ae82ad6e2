package router

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardgate/shardgate/idem"
	"github.com/shardgate/shardgate/shardmap"
)

// The benchmarks here measure the router's own CPU per POST /transfers (issue 11): everything a
// request costs besides the shard's round trip, so no database is involved.

const (
	benchBodyPlain = `{"src": 123456, "dst": 123457, "amount": 4242}`
	benchBodyFull  = `{"src": 123456, "dst": 123457, "amount": 4242, "currency": "USD", "reference": "invoice 2024-0042"}`
	benchKey       = "9f1c2d64-0a1e-4f7c-9d2b-3d8e5c1a77f0"
)

func benchRequest(body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/transfers", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", benchKey)
	r.Header.Set("Content-Type", "application/json")
	return r
}

func BenchmarkDecodeTransfer(b *testing.B) {
	for _, bc := range []struct{ name, body string }{{"plain", benchBodyPlain}, {"full", benchBodyFull}} {
		b.Run(bc.name, func(b *testing.B) {
			body := []byte(bc.body)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := DecodeTransfer(body, "EUR"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkFingerprint(b *testing.B) {
	in := TransferInput{Src: 123456, Dst: 123457, Amount: 4242, Currency: "USD", Reference: "invoice 2024-0042"}
	b.ReportAllocs()
	for b.Loop() {
		Fingerprint(http.MethodPost, "/transfers", in)
	}
}

func BenchmarkTransferID(b *testing.B) {
	ksid := shardmap.KeyspaceID(123456)
	b.ReportAllocs()
	for b.Loop() {
		TransferID(ksid, "anonymous:"+operation, benchKey)
	}
}

func BenchmarkBuildRequest(b *testing.B) {
	s := offlineServer(b, offlineYAML)
	r := benchRequest(benchBodyFull)
	a := admitted{client: "anonymous", key: benchKey,
		in: TransferInput{Src: 123456, Dst: 123457, Amount: 4242, Currency: "USD", Reference: "invoice 2024-0042"}}
	b.ReportAllocs()
	for b.Loop() {
		s.buildRequest(r, a)
	}
}

func BenchmarkReplayCache(b *testing.B) {
	s := offlineServer(b, offlineYAML)
	req := s.buildRequest(benchRequest(benchBodyPlain), admitted{client: "anonymous", key: benchKey,
		in: TransferInput{Src: 123456, Dst: 123457, Amount: 4242, Currency: "EUR"}})
	res := idem.TransferResult{Outcome: idem.Applied, Response: req.Response}
	b.Run("remember", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.replays.remember("s1", req, res)
		}
	})
	b.Run("get", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := s.replays.get(req.Scope, req.Key, req.RequestHash); !ok {
				b.Fatal("not cached")
			}
		}
	})
}

// BenchmarkAnswerApplied is the answer to a transfer the shard applied: the stored 201 and its
// count.
func BenchmarkAnswerApplied(b *testing.B) {
	s := offlineServer(b, offlineYAML)
	req := s.buildRequest(benchRequest(benchBodyPlain), admitted{client: "anonymous", key: benchKey,
		in: TransferInput{Src: 123456, Dst: 123457, Amount: 4242, Currency: "EUR"}})
	res := idem.TransferResult{Outcome: idem.Applied, Response: req.Response}
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		s.metrics.transfers.WithLabelValues(s.answer(w, "s", 1, req, res, nil), "s").Inc()
	}
}

// BenchmarkPostTransferReplay is the whole handler for a retry the replay cache answers: every
// step of a new transfer but the shard's.
func BenchmarkPostTransferReplay(b *testing.B) {
	for _, bc := range []struct{ name, body string }{{"plain", benchBodyPlain}, {"full", benchBodyFull}} {
		b.Run(bc.name, func(b *testing.B) {
			s := offlineServer(b, offlineYAML)
			first := benchRequest(bc.body)
			a, rej := s.admit(httptest.NewRecorder(), first)
			if rej != nil {
				b.Fatal(rej.detail)
			}
			req := s.buildRequest(first, a)
			s.replays.remember("s1", req, idem.TransferResult{Outcome: idem.Applied, Response: req.Response})
			body := strings.NewReader(bc.body)
			r := benchRequest(bc.body)
			b.ReportAllocs()
			for b.Loop() {
				body.Reset(bc.body)
				r.Body = io.NopCloser(body)
				w := httptest.NewRecorder()
				s.postTransfer(w, r)
				if w.Code != http.StatusCreated {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}

// BenchmarkWriteProblem is the answer to a request the router or its shard turns away: under
// overload (shard busy, in progress) it is the most common answer.
func BenchmarkWriteProblem(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		writeProblem(httptest.NewRecorder(), probInProgress, "the first attempt with this key has not finished; retry after the indicated delay", time.Second)
	}
}
