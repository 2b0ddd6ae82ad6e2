//go:build linux

package localpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
)

const (
	// closeTimeout bounds the graceful shutdown in Close before it kills.
	closeTimeout = 30 * time.Second
	// exitTimeout bounds the wait for killed processes to disappear.
	exitTimeout = 10 * time.Second
)

// Stop shuts the server down the "fast" way (SIGINT: roll back open
// transactions, checkpoint, exit) and waits for it to exit. Data and port are
// kept for Restart. Stopping a stopped server does nothing; a paused server is
// resumed first. If ctx ends before the server exits, Stop kills it and
// returns ctx's error.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return s.stopLocked(ctx)
}

func (s *Server) stopLocked(ctx context.Context) error {
	p := s.proc
	if p == nil {
		return nil
	}
	// A stopped postmaster would not act on SIGINT until continued.
	if err := s.resumeLocked(); err != nil {
		return err
	}
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("localpg: stopping postgres (pid %d): %w", p.pid(), err)
	}
	select {
	case <-p.done:
		s.proc = nil
		s.logf("postgres (pid %d) stopped", p.pid())
		return nil
	case <-ctx.Done():
		return errors.Join(
			fmt.Errorf("localpg: postgres (pid %d) did not shut down in time, so it was killed: %w", p.pid(), ctx.Err()),
			s.killLocked())
	}
}

// Restart starts the server again on the same port and data, stopping it
// first if it is running, and waits until it accepts connections. After a
// Kill, PostgreSQL runs crash recovery first. If another process holds the
// port, Restart keeps retrying until ctx ends.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if err := s.stopLocked(ctx); err != nil {
		return err
	}
	return s.run(ctx, false, true)
}

// Kill simulates a crash: it SIGKILLs the postmaster and its children and
// waits until they are gone, so that Restart can start at once (and runs
// crash recovery). Killing a server that isn't running does nothing.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	return s.killLocked()
}

func (s *Server) killLocked() error {
	p := s.proc
	if p == nil {
		return nil
	}
	s.proc = nil
	if wd := s.watchdog; wd != nil {
		wd.disarm()
		s.watchdog = nil
	}
	select {
	case <-p.done:
		return nil // already exited; its children noticed and exit on their own
	default:
	}
	// SIGKILL alone would orphan the backends, which keep the shared memory
	// attached and make the next start fail with "pre-existing shared memory
	// block is still in use". Freeze the postmaster first so it can't fork
	// while its children are collected.
	pm := p.pid()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("localpg: killing postgres (pid %d): %w", pm, err)
	}
	waitFor(time.Second, func() bool { return stopped(pm) })
	kids, err := childPIDs(pm)
	if err != nil {
		return err
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("localpg: killing postgres (pid %d): %w", pm, err)
	}
	if err := signalAll(kids, syscall.SIGKILL); err != nil {
		return err
	}
	<-p.done // SIGKILL can't be ignored
	if !waitFor(exitTimeout, func() bool { return !slices.ContainsFunc(kids, func(pid int) bool { return !exited(pid) }) }) {
		return fmt.Errorf("localpg: postgres children %v still exist %v after SIGKILL", kids, exitTimeout)
	}
	s.logf("killed postgres (pid %d) and its %d children", pm, len(kids))
	return nil
}

// Pause freezes the server like a hung host: it SIGSTOPs the postmaster and
// every child backend, so TCP connections are still accepted by the kernel
// but nothing answers. Pausing a paused server does nothing.
func (s *Server) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.running()
	switch {
	case s.closed:
		return ErrClosed
	case p == nil:
		return ErrNotRunning
	case s.watchdog != nil:
		return nil
	}
	pm := p.pid()
	// Postmaster first, and wait until it is really stopped, so that no child
	// forked after the list below is taken escapes the pause.
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("localpg: pausing postgres (pid %d): %w", pm, err)
	}
	if !waitFor(time.Second, func() bool { return stopped(pm) }) {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		return fmt.Errorf("localpg: postgres (pid %d) did not stop within a second of SIGSTOP", pm)
	}
	kids, err := childPIDs(pm)
	if err == nil {
		// Arm the watchdog before freezing the children; its list resumes
		// children first so that they are running when the postmaster tells
		// them to quit.
		s.watchdog, err = startWatchdog(append(kids, pm))
	}
	if err == nil {
		err = signalAll(kids, syscall.SIGSTOP)
	}
	if err != nil {
		_ = signalAll(append(kids, pm), syscall.SIGCONT)
		if s.watchdog != nil {
			s.watchdog.disarm()
			s.watchdog = nil
		}
		return err
	}
	s.logf("paused postgres (pid %d) and its %d children", pm, len(kids))
	return nil
}

// Resume undoes Pause. Resuming a server that isn't paused does nothing.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return ErrClosed
	case s.running() == nil:
		return ErrNotRunning
	}
	return s.resumeLocked()
}

func (s *Server) resumeLocked() error {
	wd := s.watchdog
	if wd == nil {
		return nil
	}
	s.watchdog = nil
	wd.disarm()
	if err := signalAll(wd.pids, syscall.SIGCONT); err != nil {
		return err
	}
	s.logf("resumed postgres (pid %d)", wd.pids[len(wd.pids)-1])
	return nil
}

// Close stops the server (killing it if it won't stop within 30s) and, if
// Options.Dir was empty, removes its temp dir. Close is idempotent; other
// methods return ErrClosed afterwards.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	err := s.stopLocked(ctx)
	if s.tempDir {
		err = errors.Join(err, os.RemoveAll(s.dir))
	}
	return err
}
