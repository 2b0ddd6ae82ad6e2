package shardgatetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// StartTimeout bounds how long New and Shared.Env wait for an Env to start.
const StartTimeout = 3 * time.Minute

// New starts an Env for the test t and closes it when t ends (t.Cleanup). Where no backend can
// run and CI is unset it skips t; any other failure to start fails t. When t fails, the end of
// the router's log is logged.
func New(t testing.TB, o Options) *Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	e, err := Start(ctx, o)
	if err != nil {
		failStart(t, err)
	}
	t.Cleanup(func() {
		e.logTail(t)
		if err := e.Close(); err != nil {
			t.Errorf("shardgatetest: closing the Env: %v", err)
		}
	})
	return e
}

// failStart ends t after a failed start: a skip where CanSkip allows it, a failure otherwise.
func failStart(t testing.TB, err error) {
	t.Helper()
	if CanSkip(err) {
		t.Skipf("%v (CI is unset: skipping)", err)
	}
	t.Fatalf("%v", err)
}

// logTailLines is how much of the router's log a failed test shows.
const logTailLines = 40

// logTail logs the end of the router's log if t failed.
func (e *Env) logTail(t testing.TB) {
	if !t.Failed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	logs, err := e.RouterLogs(ctx)
	if err != nil {
		t.Logf("shardgatetest: the router's log: %v", err)
		return
	}
	lines := strings.Split(strings.TrimSpace(logs), "\n")
	t.Logf("shardgatetest: the router's log, last lines:\n%s", strings.Join(lines[max(0, len(lines)-logTailLines):], "\n"))
}

// Shared is one Env for the tests of a package: the first test that asks for it starts it, and
// TestMain closes it after the tests ran. Starting an Env once rather than per test keeps a
// suite fast; its tests must then leave the shards running.
//
//	var shared = shardgatetest.NewShared(shardgatetest.Options{})
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		shared.Close()
//		os.Exit(code)
//	}
//
//	func TestTransfer(t *testing.T) {
//		env := shared.Env(t)
//		...
//	}
type Shared struct {
	opts Options
	once sync.Once
	env  *Env
	err  error
}

// NewShared returns a Shared that starts its Env with o when first asked.
func NewShared(o Options) *Shared { return &Shared{opts: o} }

var errClosed = errors.New("shardgatetest: the shared Env was closed")

// Env returns the shared Env, starting it on the first call. It skips or fails t as New does
// when the Env cannot start (every caller sees the same start error), and logs the end of the
// router's log when t fails.
func (s *Shared) Env(t testing.TB) *Env {
	t.Helper()
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
		defer cancel()
		s.env, s.err = Start(ctx, s.opts)
	})
	if s.err != nil {
		failStart(t, s.err)
	}
	t.Cleanup(func() { s.env.logTail(t) })
	return s.env
}

// Close closes the Env if it was started; afterwards Env fails every test that asks.
func (s *Shared) Close() error {
	s.once.Do(func() {})
	s.err = errClosed
	if s.env == nil {
		return nil
	}
	return s.env.Close()
}
