package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMain lets a test run this binary as the command itself, so that it can be killed.
func TestMain(m *testing.M) {
	if os.Getenv("TRANSFER_EXAMPLE_AS_MAIN") == "1" {
		main()
	}
	os.Exit(m.Run())
}

// post is one POST /transfers as the fake router received it.
type post struct{ key, body string }

// fakeRouter stands in for shardgate: it applies a key once, replays it afterwards, and can be
// told how to answer instead.
type fakeRouter struct {
	mu      sync.Mutex
	posts   []post
	applied map[string]string // key → the stored 201 body
	// answer, if set, answers instead of applying; returning false lets the request apply.
	answer func(w http.ResponseWriter, n int) bool
	// holdFirst applies the first transfer, closes arrived, and never answers it.
	holdFirst bool
	arrived   chan struct{}
}

// newFakeRouter serves a fakeRouter, set up by configure before it serves.
func newFakeRouter(t *testing.T, configure func(*fakeRouter)) (*fakeRouter, string) {
	f := &fakeRouter{applied: map[string]string{}, arrived: make(chan struct{})}
	configure(f)
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

func (f *fakeRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer tok" {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	key, _ := strconv.Unquote(r.Header.Get("Idempotency-Key"))
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.posts = append(f.posts, post{key, string(body)})
	n := len(f.posts)
	if f.answer != nil && f.answer(w, n) {
		f.mu.Unlock()
		return
	}
	stored, replayed := f.applied[key]
	if !replayed {
		stored = fmt.Sprintf(`{"id":"t-%d",%s`, len(f.applied)+1, strings.TrimPrefix(string(body), "{"))
		f.applied[key] = stored
	}
	hold := f.holdFirst && n == 1
	f.mu.Unlock()
	if hold {
		close(f.arrived)
		<-r.Context().Done() // until the client is gone
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, stored)
}

func (f *fakeRouter) snapshot() ([]post, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]post(nil), f.posts...), len(f.applied)
}

func readJournal(t *testing.T, path string) *journal {
	t.Helper()
	j, err := openJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func runCmd(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		if k == "SHARDGATE_TOKEN" {
			return "tok"
		}
		return ""
	}
	code := run(context.Background(), args, getenv, &out, &errOut)
	return code, out.String() + errOut.String()
}

// TestCrashDuringSendResumesWithTheSameKey kills the command while the router holds its first
// transfer (applied, not yet answered), then resumes from the state file: the transfer must be
// sent again with the same key and body, and be applied once.
func TestCrashDuringSendResumesWithTheSameKey(t *testing.T) {
	f, url := newFakeRouter(t, func(f *fakeRouter) { f.holdFirst = true })
	state := filepath.Join(t.TempDir(), "transfers.json")
	cmd := exec.Command(os.Args[0], "--url", url, "--state", state, "-src", "8842", "-dst", "1190", "-amount", "2500", "-reference", "rent")
	cmd.Env = append(os.Environ(), "TRANSFER_EXAMPLE_AS_MAIN=1", "SHARDGATE_TOKEN=tok")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.arrived:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("the transfer never reached the router")
	}
	// The transfer reached the router, so it was stored before: with the key it was sent with.
	j := readJournal(t, state)
	posts, _ := f.snapshot()
	if len(j.Operations) != 1 || j.Operations[0].State != statePending || j.Operations[0].Transfer.Key != posts[0].key {
		t.Fatalf("state file before the crash: %+v; want the transfer pending under key %q", j.Operations, posts[0].key)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait() //nolint:errcheck // killed on purpose

	code, out := runCmd(t, "--url", url, "--state", state)
	if code != 0 {
		t.Fatalf("resume: exit %d: %s", code, out)
	}
	posts, applied := f.snapshot()
	if len(posts) != 2 || posts[1] != posts[0] || applied != 1 {
		t.Fatalf("router saw %+v and applied %d transfers; want the same key and body twice, applied once", posts, applied)
	}
	op := readJournal(t, state).Operations[0]
	if op.State != stateApplied || !op.Replayed || op.TransferID != "t-1" || op.Transfer.Reference != "rent" {
		t.Errorf("after resume: %+v", op)
	}
	if !strings.Contains(out, "applied "+op.Transfer.Key) {
		t.Errorf("output %q does not report the applied transfer", out)
	}

	// Nothing is pending any more: another run sends nothing, and says so.
	want := "nothing pending: all 1 transfers in " + state + " are settled (1 applied, 0 rejected, 0 expired)"
	if code, out := runCmd(t, "--url", url, "--state", state); code != 0 || !strings.Contains(out, want) {
		t.Errorf("third run: exit %d, output %q; want 0 and %q", code, out, want)
	}
	if posts, _ := f.snapshot(); len(posts) != 2 {
		t.Errorf("third run sent %d more requests", len(posts)-2)
	}
}

// A first run with an empty state file and nothing to enqueue says how to add a transfer.
func TestNothingToSend(t *testing.T) {
	state := filepath.Join(t.TempDir(), "transfers.json")
	if code, out := runCmd(t, "--url", "http://127.0.0.1:1", "--state", state); code != 0 || !strings.Contains(out, "nothing pending: "+state+" holds no transfers; enqueue one with -src, -dst and -amount") {
		t.Errorf("exit %d, output %q", code, out)
	}
}

// TestUnknownOutcomeStaysPending checks that a transfer whose retries ran out is kept and sent
// again by the next run with its key, while a new one is enqueued beside it.
func TestUnknownOutcomeStaysPending(t *testing.T) {
	f, url := newFakeRouter(t, func(f *fakeRouter) {
		f.answer = func(w http.ResponseWriter, n int) bool {
			if n > 1 {
				return false
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"type":"https://shardgate.dev/problems/shard-unavailable","title":"t","status":503}`)
			return true
		}
	})
	state := filepath.Join(t.TempDir(), "transfers.json")
	code, out := runCmd(t, "--url", url, "--state", state, "-timeout", "1s", "-src", "1", "-dst", "2", "-amount", "3")
	if code != 1 || !strings.Contains(out, "pending") || !strings.Contains(out, "keep the key") {
		t.Fatalf("first run: exit %d, output %q; want the transfer left pending", code, out)
	}
	code, out = runCmd(t, "--url", url, "--state", state, "-src", "4", "-dst", "5", "-amount", "6")
	if code != 0 {
		t.Fatalf("second run: exit %d: %s", code, out)
	}
	posts, applied := f.snapshot()
	j := readJournal(t, state)
	if len(posts) != 3 || posts[1].key != posts[0].key || posts[2].key == posts[0].key || applied != 2 {
		t.Errorf("router saw %+v; want the pending key again, then a new one", posts)
	}
	for _, op := range j.Operations {
		if op.State != stateApplied || op.Replayed {
			t.Errorf("operation %+v", op)
		}
	}
}

func TestRejectedTransferIsNotSentAgain(t *testing.T) {
	f, url := newFakeRouter(t, func(f *fakeRouter) {
		f.answer = func(w http.ResponseWriter, n int) bool {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"type":"https://shardgate.dev/problems/invalid-request-body","title":"t","status":400,"detail":"src and dst must differ"}`)
			return true
		}
	})
	state := filepath.Join(t.TempDir(), "transfers.json")
	if code, out := runCmd(t, "--url", url, "--state", state, "-src", "1", "-dst", "1", "-amount", "3"); code != 1 || !strings.Contains(out, "rejected") {
		t.Fatalf("exit %d, output %q", code, out)
	}
	if code, _ := runCmd(t, "--url", url, "--state", state); code != 0 {
		t.Errorf("second run: exit %d", code)
	}
	if posts, _ := f.snapshot(); len(posts) != 1 {
		t.Errorf("a rejected transfer was sent %d times", len(posts))
	}
	if op := readJournal(t, state).Operations[0]; op.State != stateRejected || !strings.Contains(op.LastError, "src and dst must differ") {
		t.Errorf("operation %+v", op)
	}
}

func TestJournalSaveIsAtomic(t *testing.T) {
	dir := t.TempDir()
	j := &journal{path: filepath.Join(dir, "s.json")}
	j.Operations = append(j.Operations, &operation{State: statePending})
	for range 3 {
		if err := j.save(); err != nil {
			t.Fatal(err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the directory holds %d files; temporary files must not be left behind", len(entries))
	}
	if err := os.WriteFile(j.path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openJournal(j.path); err == nil {
		t.Error("a damaged state file was read as empty")
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"-src", "1"}, {"-timeout", "0"}, {"extra"}, {"--url", "localhost"}} {
		if code, _ := runCmd(t, append([]string{"--state", filepath.Join(t.TempDir(), "s")}, args...)...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}
