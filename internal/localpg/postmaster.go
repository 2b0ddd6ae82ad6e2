//go:build linux

package localpg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

const (
	// maxPortAttempts bounds how often Start picks a new free port after
	// losing one to another process.
	maxPortAttempts = 5
	// logTailLines and logTailBytes bound the part of the server log quoted in errors.
	logTailLines = 30
	logTailBytes = 64 << 10
)

// errPortInUse marks a start that failed only because the port was taken, so
// that it can be retried.
var errPortInUse = errors.New("port already in use")

// A process is one run of the postmaster.
type process struct {
	cmd       *exec.Cmd
	logOffset int64         // where this run's output starts in the log
	done      chan struct{} // closed once the postmaster has exited and been reaped
	err       error         // cmd.Wait's result, valid after done
}

func (p *process) pid() int { return p.cmd.Process.Pid }

// running returns the live postmaster, or nil if the server was stopped or
// killed or its postmaster died on its own.
func (s *Server) running() *process {
	if s.proc == nil {
		return nil
	}
	select {
	case <-s.proc.done:
		return nil
	default:
		return s.proc
	}
}

// prepareCmd sets what initdb and postgres have in common.
func (s *Server) prepareCmd(cmd *exec.Cmd) {
	cmd.Dir = s.dir
	cmd.Env = serverEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: s.acct.credential(),
		Setpgid:    true,
		Pdeathsig:  parentDeathSignal,
	}
}

// serverEnv is this process's environment without the PG* variables (a
// developer's PGDATA or PGPORT must not redirect our server) and with the C
// locale.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PG") || strings.HasPrefix(kv, "LC_") || strings.HasPrefix(kv, "LANG=") || strings.HasPrefix(kv, "LANGUAGE=") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "LC_ALL=C")
}

// serverArgs returns the postgres command line for port.
func (s *Server) serverArgs(port int) []string {
	settings := map[string]string{
		"listen_addresses": "127.0.0.1",
		"port":             strconv.Itoa(port),
		// A quoted list entry, so that a Dir with spaces or commas works.
		"unix_socket_directories": quoteListEntry(s.sockDir),
		// Small enough that several shards fit on a laptop or CI machine.
		"shared_buffers":  "32MB",
		"max_connections": "100",
	}
	if !s.opts.Durable {
		// Both only matter if the OS crashes. synchronous_commit stays on:
		// turning it off would gain little once fsync is off, and would make
		// a Kill lose commits that were already acknowledged.
		settings["fsync"] = "off"
		settings["full_page_writes"] = "off"
	}
	for name, value := range s.opts.Settings {
		settings[strings.ToLower(name)] = value
	}
	args := []string{"-D", s.dataDir}
	for _, name := range slices.Sorted(maps.Keys(settings)) {
		args = append(args, "-c", name+"="+settings[name])
	}
	return args
}

func quoteListEntry(dir string) string {
	if dir == "" {
		return "" // no unix socket
	}
	return `"` + strings.ReplaceAll(dir, `"`, `""`) + `"`
}

// run starts the postmaster and waits until it accepts connections. With pick
// it chooses a fresh free port, and another one if that is lost to another
// process; with retryBusy it waits for s.port to become free until ctx ends.
func (s *Server) run(ctx context.Context, pick, retryBusy bool) error {
	for attempt := 1; ; attempt++ {
		port := s.port
		if pick {
			p, err := FreePort()
			if err != nil {
				return err
			}
			port = p
		}
		p, err := s.launch(port)
		if err != nil {
			return err
		}
		err = s.waitReady(ctx, p, port)
		if err == nil {
			s.proc = p
			if pick {
				s.port = port // Restart never changes it, so DSN and Port need no lock
			}
			s.logf("postgres (pid %d) accepts connections on 127.0.0.1:%d; log: %s", p.pid(), port, s.logPath)
			return nil
		}
		s.proc = p
		if kerr := s.killLocked(); kerr != nil {
			return errors.Join(err, kerr)
		}
		switch {
		case !errors.Is(err, errPortInUse):
			return err
		case pick && attempt < maxPortAttempts:
			s.logf("port %d was taken before postgres could bind it; trying another", port)
		case retryBusy:
			if attempt == 1 {
				s.logf("port %d is in use; retrying until it is free", port)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("localpg: restarting on port %d: %w (last attempt: %w)", port, ctx.Err(), err)
			case <-time.After(200 * time.Millisecond):
			}
		default:
			return err
		}
	}
}

// launch starts a postmaster on port without waiting for it.
func (s *Server) launch(port int) (*process, error) {
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("localpg: opening server log: %w", err)
	}
	defer logFile.Close() // postgres has its own descriptor
	offset, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, fmt.Errorf("localpg: opening server log: %w", err)
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), s.serverArgs(port)...)
	s.prepareCmd(cmd)
	// Pass the file itself, not a writer, so that no goroutine copies output
	// and the log is written even while this process is paused in a debugger.
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("localpg: starting postgres: %w", err)
	}
	p := &process{cmd: cmd, logOffset: offset, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitReady polls until the postmaster p accepts a connection, exits, or ctx
// ends.
func (s *Server) waitReady(ctx context.Context, p *process, port int) error {
	cfg, err := pgx.ParseConfig(s.dsn(port, "postgres"))
	if err != nil {
		return fmt.Errorf("localpg: building the readiness check's connection config: %w", err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var lastErr error
	for {
		select {
		case <-p.done:
			tail := s.logTail(p.logOffset)
			if strings.Contains(tail, "could not bind") || strings.Contains(tail, "Address already in use") {
				return fmt.Errorf("localpg: postgres could not listen on 127.0.0.1:%d: %w", port, errPortInUse)
			}
			exitErr := p.err
			if exitErr == nil {
				exitErr = errors.New("exit status 0")
			}
			return fmt.Errorf("localpg: postgres exited during startup (%w); %s ends with:\n%s", exitErr, s.logPath, tail)
		case <-ctx.Done():
			return fmt.Errorf("localpg: postgres on port %d was not ready in time: %w (last attempt: %v); %s ends with:\n%s",
				port, ctx.Err(), lastErr, s.logPath, s.logTail(p.logOffset))
		default:
		}
		lastErr = s.checkReady(ctx, cfg)
		if lastErr == nil {
			return nil
		}
		if errors.Is(lastErr, errPortInUse) {
			return lastErr
		}
		var pgErr *pgconn.PgError
		if errors.As(lastErr, &pgErr) && pgErr.Code != "57P03" { // 57P03: still starting up
			hint := ""
			if s.reused && s.opts.Password != "" && strings.HasPrefix(pgErr.Code, "28") {
				hint = " (a reused Options.Dir keeps the password it was initialized with)"
			}
			return fmt.Errorf("localpg: postgres on port %d refused the connection%s: %w", port, hint, lastErr)
		}
		select {
		case <-tick.C:
		case <-p.done:
		case <-ctx.Done():
		}
	}
}

// checkReady connects once and makes sure the server that answered is ours:
// if another server holds the port, ours is about to fail to bind, but the
// other one could answer first.
func (s *Server) checkReady(ctx context.Context, cfg *pgx.ConnConfig) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dataDir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil || dataDir != s.dataDir {
		return fmt.Errorf("localpg: another server answers on port %d: %w", cfg.Port, errPortInUse)
	}
	return nil
}

// logTail returns the last lines the server logged since offset.
func (s *Server) logTail(offset int64) string {
	f, err := os.Open(s.logPath)
	if err != nil {
		return fmt.Sprintf("(server log unreadable: %v)", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(server log unreadable: %v)", err)
	}
	from := max(offset, fi.Size()-logTailBytes)
	b := make([]byte, max(fi.Size()-from, 0))
	if _, err := f.ReadAt(b, from); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Sprintf("(server log unreadable: %v)", err)
	}
	return lastLines(string(b))
}

func lastLines(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return strings.Join(lines, "\n")
}
