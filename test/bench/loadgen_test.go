package bench

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"
)

// transfer is one POST /transfers request: its Idempotency-Key and body.
type transfer struct {
	key  string
	body []byte
}

// loadgen drives POST /transfers over real HTTP/TCP with a fixed number of workers, each sending
// its next request as soon as the previous one is answered (a closed loop, like pgbench).
type loadgen struct {
	client *http.Client
	url    string // http://host:port/transfers
}

func newLoadgen(baseURL string, workers int) *loadgen {
	tr := &http.Transport{
		MaxIdleConns:        workers,
		MaxIdleConnsPerHost: workers, // every worker keeps its connection alive between requests
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	return &loadgen{client: &http.Client{Transport: tr}, url: baseURL + "/transfers"}
}

// loadResult is what one run of the load generator saw.
type loadResult struct {
	ok      int64         // answers as expected: 201, replayed or not as asked
	elapsed time.Duration // from the first request until the last worker's last answer
	latency time.Duration // summed over the ok requests, from sending to having read the answer
	err     error         // the first unexpected answer; it ends the run
	created []transfer    // new-key runs only: every transfer answered 201, for replaying
}

// run sends requests from workers goroutines until d has passed. With replay nil every request
// has a fresh key and must be answered 201 without Idempotent-Replayed; otherwise every request
// is a random element of replay, sent again, and must be answered 201 with
// Idempotent-Replayed: true. The first other answer, or transport error, ends the run.
func (g *loadgen) run(ctx context.Context, workers int, d time.Duration, replay []transfer) loadResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel() // the other workers' requests then fail too, but only the first error is kept
	}
	results := make([]loadResult, workers)
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), uint64(w)))
			res := &results[w]
			for time.Now().Before(deadline) && ctx.Err() == nil {
				var t transfer
				if replay == nil {
					src := rng.Int64N(1_000_000) + 1
					t = transfer{
						key:  crand.Text(),
						body: fmt.Appendf(nil, `{"src": %d, "dst": %d, "amount": %d}`, src, src+1, rng.Int64N(100_000)+1),
					}
				} else {
					t = replay[rng.IntN(len(replay))]
				}
				sent := time.Now()
				if err := g.post(ctx, t, replay != nil); err != nil {
					fail(err)
					return
				}
				res.latency += time.Since(sent)
				res.ok++
				if replay == nil {
					res.created = append(res.created, t)
				}
			}
		})
	}
	wg.Wait()
	total := loadResult{elapsed: time.Since(start), err: firstErr}
	for _, r := range results {
		total.ok += r.ok
		total.latency += r.latency
		total.created = append(total.created, r.created...)
	}
	return total
}

// post sends t and checks the answer.
func (g *loadgen) post(ctx context.Context, t transfer, wantReplayed bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(t.body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", t.key)
	resp, err := g.client.Do(req)
	if err != nil {
		return err
	}
	// Read the body to its end so that the connection is reused.
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("POST /transfers with key %s: reading the answer: %w", t.key, err)
	}
	replayed := resp.Header.Get("Idempotent-Replayed") == "true"
	if resp.StatusCode != http.StatusCreated || replayed != wantReplayed {
		return fmt.Errorf("POST /transfers with key %s: got %d (Idempotent-Replayed: %q), want 201 with replayed=%t; body: %.300s",
			t.key, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), wantReplayed, body)
	}
	return nil
}
