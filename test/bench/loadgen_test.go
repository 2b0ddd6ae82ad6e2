package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

// transfer is one POST /transfers request: its Idempotency-Key and body.
type transfer struct {
	key  string
	body []byte
}

// newTransfer returns a transfer of amount from src to src+1 under a fresh key, a UUIDv7 as the
// Go client mints them.
func newTransfer(src, amount int64) transfer { return newTransferTo(src, src+1, amount) }

// newTransferTo returns a transfer of amount from src to dst under a fresh key.
func newTransferTo(src, dst, amount int64) transfer {
	return transfer{
		key:  uuid.Must(uuid.NewV7()).String(),
		body: fmt.Appendf(nil, `{"src": %d, "dst": %d, "amount": %d}`, src, dst, amount),
	}
}

// loadgen drives POST /transfers over real HTTP/TCP with a fixed number of workers, each sending
// its next request as soon as the previous one is answered (a closed loop, like pgbench).
type loadgen struct {
	client *http.Client
	url    string // http://host:port/transfers
	// pick chooses a new transfer's accounts; nil picks src among the first million and dst =
	// src+1, which the one bench shard both owns.
	pick func(rng *rand.Rand) (src, dst int64)
}

// newLoadgen returns a load generator for the server at baseURL that keeps a connection alive
// for each of up to workers workers.
func newLoadgen(baseURL string, workers int) *loadgen {
	tr := &http.Transport{
		MaxIdleConns:        workers,
		MaxIdleConnsPerHost: workers,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}
	return &loadgen{client: &http.Client{Transport: tr}, url: baseURL + "/transfers"}
}

// loadResult is what one run of the load generator saw.
type loadResult struct {
	ok        int64           // answers as expected: 201, replayed or not as asked
	elapsed   time.Duration   // from the first request until the last worker's last answer
	latencies []time.Duration // of each ok request, from sending to having read the answer; sorted
	err       error           // the first unexpected answer; it ends the run
	created   []transfer      // new-key runs only: every transfer answered 201, for replaying
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
			res.latencies = make([]time.Duration, 0, 1024)
			for time.Now().Before(deadline) && ctx.Err() == nil {
				var t transfer
				switch {
				case replay == nil && g.pick != nil:
					src, dst := g.pick(rng)
					t = newTransferTo(src, dst, rng.Int64N(100_000)+1)
				case replay == nil:
					t = newTransfer(rng.Int64N(1_000_000)+1, rng.Int64N(100_000)+1)
				default:
					t = replay[rng.IntN(len(replay))]
				}
				sent := time.Now()
				if err := g.post(ctx, t, replay != nil); err != nil {
					fail(err)
					return
				}
				res.latencies = append(res.latencies, time.Since(sent))
				if replay == nil {
					res.created = append(res.created, t)
				}
			}
		})
	}
	wg.Wait()
	total := loadResult{elapsed: time.Since(start), err: firstErr}
	for _, r := range results {
		total.latencies = append(total.latencies, r.latencies...)
		total.created = append(total.created, r.created...)
	}
	total.ok = int64(len(total.latencies))
	slices.Sort(total.latencies)
	return total
}

// answer is what a server answered to POST /transfers, as far as the load generator checks it.
type answer struct {
	status                          int
	contentType, location, replayed string // headers
	body                            []byte
}

func (a answer) String() string {
	return fmt.Sprintf("%d Content-Type: %q Location: %q Idempotent-Replayed: %q body: %q",
		a.status, a.contentType, a.location, a.replayed, a.body)
}

// exchange sends t and reads the answer.
func (g *loadgen) exchange(ctx context.Context, t transfer) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(t.body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", t.key)
	resp, err := g.client.Do(req)
	if err != nil {
		return answer{}, err
	}
	// Read the body to its end so that the connection is reused.
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return answer{}, fmt.Errorf("POST /transfers with key %s: reading the answer: %w", t.key, err)
	}
	h := resp.Header
	return answer{resp.StatusCode, h.Get("Content-Type"), h.Get("Location"), h.Get("Idempotent-Replayed"), body}, nil
}

// post sends t and checks that it is answered 201, replayed or not as wanted.
func (g *loadgen) post(ctx context.Context, t transfer, wantReplayed bool) error {
	a, err := g.exchange(ctx, t)
	if err != nil {
		return err
	}
	if a.status != http.StatusCreated || (a.replayed == "true") != wantReplayed {
		return fmt.Errorf("POST /transfers with key %s: got %d (Idempotent-Replayed: %q), want 201 with replayed=%t; body: %.300s",
			t.key, a.status, a.replayed, wantReplayed, a.body)
	}
	return nil
}
