package localpg

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyOptions configures a streaming standby made by Server.StartStandby.
type StandbyOptions struct {
	// Name is the standby's application_name, which synchronous_standby_names matches; default
	// "standby".
	Name string
	// Sync makes the primary wait for this standby: synchronous_standby_names is set to its
	// name (ALTER SYSTEM, reloaded), and StartStandby returns once the primary reports it sync.
	// Otherwise it replicates asynchronously.
	Sync bool
	// Dir is the standby's directory as in Options.Dir; empty means a fresh temp dir.
	Dir string
	// Logf as in Options.Logf.
	Logf func(format string, args ...any)
}

// StartStandby makes a streaming standby of s: a pg_basebackup -R copy of its data directory,
// started on its own free port, with the same user, password and database. s is allowed
// replication connections on its unix socket (or on TCP with its password, when the socket path
// is too long). It returns once the standby streams from s (and, with Sync, once s reports it
// as its synchronous standby). The standby's DSN reads; after Promote it writes too.
func (s *Server) StartStandby(ctx context.Context, o StandbyOptions) (*Server, error) {
	if o.Name == "" {
		o.Name = "standby"
	}
	if err := s.allowReplication(ctx); err != nil {
		return nil, err
	}
	opts := s.opts
	opts.Dir, opts.Port, opts.Logf, opts.name = o.Dir, 0, o.Logf, o.Name
	sb := &Server{opts: opts, bin: s.bin, acct: s.acct}
	if err := sb.prepareDir(); err != nil {
		return nil, err
	}
	fail := func(err error) (*Server, error) {
		if sb.tempDir {
			err = errors.Join(err, os.RemoveAll(sb.dir))
		}
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(sb.dataDir, "PG_VERSION")); err == nil {
		return fail(fmt.Errorf("localpg: %s holds a data directory already; a standby is made from an empty StandbyOptions.Dir", sb.dataDir))
	}
	if err := sb.basebackup(ctx, s, o.Name); err != nil {
		return fail(err)
	}
	// start prepares the directory again: it is the one made above now, still removed by Close
	// if it was a temp dir.
	temp := sb.tempDir
	sb.opts.Dir = sb.dir
	err := sb.start(ctx)
	sb.tempDir = temp
	if err != nil {
		return fail(err)
	}
	if o.Sync {
		if err := s.exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = "+quoteLiteral(pgx.Identifier{o.Name}.Sanitize())); err != nil {
			return nil, errors.Join(err, sb.Close())
		}
		if err := s.exec(ctx, "SELECT pg_reload_conf()"); err != nil {
			return nil, errors.Join(err, sb.Close())
		}
	}
	want := "async"
	if o.Sync {
		want = "sync"
	}
	if err := s.waitReplication(ctx, o.Name, want); err != nil {
		return nil, errors.Join(fmt.Errorf("%w; the standby's log ends with:\n%s", err, sb.logTail(0)), sb.Close())
	}
	return sb, nil
}

// allowReplication adds replication lines to s's pg_hba.conf (rewritten at each start, so added
// again by each StartStandby) and reloads it.
func (s *Server) allowReplication(ctx context.Context) error {
	method := "trust"
	if s.opts.Password != "" {
		method = "scram-sha-256"
	}
	path := filepath.Join(s.dataDir, "pg_hba.conf")
	hba, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("localpg: reading %s: %w", path, err)
	}
	if !strings.Contains(string(hba), "replication") {
		hba = append(hba, "local replication all trust\nhost  replication all 127.0.0.1/32 "+method+"\n"...)
		if err := os.WriteFile(path, hba, 0o600); err != nil {
			return fmt.Errorf("localpg: writing %s: %w", path, err)
		}
		if err := s.acct.chown(path); err != nil {
			return err
		}
	}
	return s.exec(ctx, "SELECT pg_reload_conf()")
}

// conninfo is how a standby reaches s for replication: by its unix socket, or by TCP with the
// password when s has no socket.
func (s *Server) conninfo(name string) string {
	parts := []string{"user=" + quoteConn(s.opts.User), "application_name=" + quoteConn(name)}
	if s.sockDir != "" {
		parts = append(parts, "host="+quoteConn(s.sockDir), "port="+strconv.Itoa(s.port))
	} else {
		parts = append(parts, "host=127.0.0.1", "port="+strconv.Itoa(s.port))
		if s.opts.Password != "" {
			parts = append(parts, "password="+quoteConn(s.opts.Password))
		}
	}
	return strings.Join(parts, " ")
}

// basebackup copies primary's data directory into sb's with pg_basebackup -R (standby.signal
// and primary_conninfo), streaming the WAL it needs.
func (sb *Server) basebackup(ctx context.Context, primary *Server, name string) error {
	building := sb.dataDir + ".basebackup"
	if err := os.RemoveAll(building); err != nil {
		return fmt.Errorf("localpg: removing an unfinished base backup: %w", err)
	}
	defer os.RemoveAll(building) // a no-op once renamed
	args := []string{"-D", building, "-d", primary.conninfo(name), "-R", "-X", "stream", "-c", "fast", "--no-sync"}
	cmd := exec.CommandContext(ctx, filepath.Join(sb.bin, "pg_basebackup"), args...)
	sb.prepareCmd(cmd)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	err := spawn(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		return fmt.Errorf("localpg: pg_basebackup of the server on port %d failed: %w; its output ends with:\n%s", primary.port, err, lastLines(out.String()))
	}
	// -R writes the connection it used; the standby's application_name is set in any case, as
	// synchronous_standby_names matches it.
	auto := filepath.Join(building, "postgresql.auto.conf")
	f, err := os.OpenFile(auto, os.O_APPEND|os.O_WRONLY, 0o600)
	if err == nil {
		_, err = fmt.Fprintf(f, "primary_conninfo = %s\n", quoteLiteral(primary.conninfo(name)))
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		return fmt.Errorf("localpg: writing the standby's primary_conninfo: %w", err)
	}
	if err := os.Rename(building, sb.dataDir); err != nil {
		return fmt.Errorf("localpg: moving the base backup into place: %w", err)
	}
	sb.logf("base backup of port %d in %s", primary.port, sb.dataDir)
	return nil
}

// waitReplication waits until s's pg_stat_replication shows the standby name streaming with
// sync_state want.
func (s *Server) waitReplication(ctx context.Context, name, want string) error {
	conn, err := pgx.Connect(ctx, s.dsn(s.port, "postgres"))
	if err != nil {
		return fmt.Errorf("localpg: connecting to watch replication: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for {
		var state, syncState string
		err := conn.QueryRow(ctx, "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1", name).Scan(&state, &syncState)
		if err == nil && state == "streaming" && syncState == want {
			return nil
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("localpg: reading pg_stat_replication: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("localpg: standby %q is not streaming as %s (state %q, sync_state %q): %w", name, want, state, syncState, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// walReceiverPID returns the pid of the standby's WAL receiver.
func (s *Server) walReceiverPID(ctx context.Context) (int, error) {
	conn, err := pgx.Connect(ctx, s.dsn(s.port, "postgres"))
	if err != nil {
		return 0, fmt.Errorf("localpg: connecting to the standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var pid int
	if err := conn.QueryRow(ctx, "SELECT pid FROM pg_stat_wal_receiver").Scan(&pid); err != nil {
		return 0, fmt.Errorf("localpg: the standby has no WAL receiver: %w", err)
	}
	return pid, nil
}

// StallReceiver stops the standby's WAL receiver process (SIGSTOP): it neither writes, flushes
// nor acknowledges WAL any more, so a primary waiting for it as a synchronous standby waits,
// and what the primary commits from now on is missing here. Pausing replay
// (pg_wal_replay_pause) is not the same: the receiver keeps flushing and acknowledging, and a
// synchronous commit (on, not remote_apply) still returns. ResumeReceiver undoes it; Promote
// kills the stopped receiver.
func (s *Server) StallReceiver(ctx context.Context) error {
	pid, err := s.walReceiverPID(ctx)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("localpg: stopping the WAL receiver (pid %d): %w", pid, err)
	}
	if !waitFor(5*time.Second, func() bool { return stopped(pid) }) {
		return fmt.Errorf("localpg: the WAL receiver (pid %d) did not stop", pid)
	}
	s.mu.Lock()
	s.stalled = pid
	s.mu.Unlock()
	return nil
}

// ResumeReceiver continues a WAL receiver stopped by StallReceiver; without one it does nothing.
func (s *Server) ResumeReceiver() error {
	s.mu.Lock()
	pid := s.stalled
	s.stalled = 0
	s.mu.Unlock()
	if pid == 0 {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("localpg: continuing the WAL receiver (pid %d): %w", pid, err)
	}
	return nil
}

// Promote makes the standby a primary (pg_promote, waiting for it to end) on a new timeline.
// A WAL receiver stalled by StallReceiver is killed first, as when the standby's host loses
// what had not reached its disk: WAL its primary sent after the stall, still in the socket, is
// never written here (a stopped receiver could not end, and promotion waits for it to). The
// standby's postmaster restarts its processes after the kill, and the promotion follows. Kill
// the primary before promoting, as a failover does.
func (s *Server) Promote(ctx context.Context) error {
	s.mu.Lock()
	pid := s.stalled
	s.stalled = 0
	s.mu.Unlock()
	if pid != 0 {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("localpg: killing the stalled WAL receiver (pid %d): %w", pid, err)
		}
		if !waitFor(10*time.Second, func() bool { return exited(pid) }) {
			return fmt.Errorf("localpg: the stalled WAL receiver (pid %d) did not exit", pid)
		}
	}
	var lastErr error
	for {
		ok, err := s.promote(ctx)
		switch {
		case err == nil && ok:
			return nil
		case err == nil:
			return errors.New("localpg: the standby was not promoted within 60s; see its log")
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("localpg: promoting the standby: %w (last attempt: %w)", ctx.Err(), lastErr)
		case <-time.After(100 * time.Millisecond): // restarting after the receiver's kill
		}
	}
}

// promote asks the standby to promote itself, once.
func (s *Server) promote(ctx context.Context) (bool, error) {
	conn, err := pgx.Connect(ctx, s.dsn(s.port, "postgres"))
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	err = conn.QueryRow(ctx, "SELECT pg_promote(true, 60)").Scan(&ok)
	return ok, err
}

// exec runs sql on s's postgres database as its superuser.
func (s *Server) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.dsn(s.port, "postgres"))
	if err != nil {
		return fmt.Errorf("localpg: connecting to the server on port %d: %w", s.port, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("localpg: %s: %w", strings.Fields(sql)[0], err)
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal.
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// quoteConn quotes a libpq connection string value.
func quoteConn(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}
