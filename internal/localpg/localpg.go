//go:build linux

package localpg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Options configures a server. The zero value is a fast, throwaway server in
// a temp dir on a free port.
type Options struct {
	// Dir holds this server's data directory (Dir/data), its unix socket and
	// its log (Dir/postgres.log); it is created if missing, and an existing
	// data directory is reused. Empty means a fresh temp dir that Close
	// removes. When running as root, Dir is given to the server's user and
	// any ancestor that user can't enter gets o+x.
	Dir string
	// Port is the TCP port on 127.0.0.1; 0 picks a free one.
	Port int
	// User is the database superuser; default "shardgate".
	User string
	// Password, if non-empty, makes TCP connections authenticate with
	// scram-sha-256. It is set when the data directory is initialized, so a
	// reused Dir keeps the password it was created with. Empty means trust
	// (the server listens on 127.0.0.1 only).
	Password string
	// Database is created after start if missing; default "ledger".
	Database string
	// Durable false (the default) turns off fsync and full_page_writes, which
	// makes tests fast and only risks data on an OS crash. Commits stay
	// synchronous, so a Kill (a process crash) loses no acknowledged commit.
	// True keeps PostgreSQL's defaults, for benchmarks.
	Durable bool
	// Settings are extra server settings passed as -c name=value; they
	// override localpg's defaults (shared_buffers=32MB, max_connections=100,
	// and the Durable ones) but may not set what localpg manages: port,
	// listen_addresses, unix_socket_directories, data_directory, config_file,
	// hba_file.
	Settings map[string]string
	// Logf, if set, receives localpg's own progress messages. The server's
	// log always goes to Dir/postgres.log; its last lines are included in
	// startup errors.
	Logf func(format string, args ...any)

	name string // set by StartCluster to label log messages
}

// managedSettings are chosen by localpg and so refused in Options.Settings.
var managedSettings = []string{"port", "listen_addresses", "unix_socket_directories", "data_directory", "config_file", "hba_file"}

// ErrClosed is returned by methods of a Server after Close.
var ErrClosed = errors.New("localpg: server is closed")

// ErrNotRunning is returned by Pause and Resume when the server has been
// stopped or killed and not restarted, or its postmaster died.
var ErrNotRunning = errors.New("localpg: server is not running")

// errPortInUse marks a start that failed only because the port was taken, so
// that it can be retried.
var errPortInUse = errors.New("port already in use")

const (
	// maxPortAttempts bounds how often Start picks a new free port after
	// losing one to another process.
	maxPortAttempts = 5
	// closeTimeout bounds the graceful shutdown in Close before it kills.
	closeTimeout = 30 * time.Second
	// exitTimeout bounds the wait for killed processes to disappear.
	exitTimeout = 10 * time.Second
	// maxSocketPath is the longest unix socket path the kernel accepts
	// (sizeof(sun_path) - 1).
	maxSocketPath = 107
	logTailLines  = 30
	logTailBytes  = 64 << 10
)

// A Server is a local PostgreSQL server started by Start. Its methods are safe
// for concurrent use and run one at a time.
type Server struct {
	opts    Options // with defaults applied
	bin     string
	dir     string
	dataDir string
	sockDir string // "" when Dir's path is too long for a unix socket
	logPath string
	tempDir bool
	reused  bool     // the data directory existed before Start
	acct    *account // nil when not running as root
	port    int      // fixed once Start returns

	mu       sync.Mutex
	proc     *process  // nil while stopped
	watchdog *watchdog // non-nil while paused
	stalled  int       // the pid of a WAL receiver stopped by StallReceiver
	closed   bool
}

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

// Start initializes Options.Dir with initdb unless it already holds a data
// directory, starts postgres on 127.0.0.1:Port with its unix socket in Dir,
// waits until it accepts connections, and creates Database if missing. ctx
// bounds the whole startup, not the server's lifetime.
func Start(ctx context.Context, opts Options) (*Server, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	acct, err := serverAccount()
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, bin: bin, acct: acct}
	if err := s.start(ctx); err != nil {
		if s.tempDir {
			err = errors.Join(err, os.RemoveAll(s.dir))
		}
		return nil, err
	}
	return s, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.User == "" {
		o.User = "shardgate"
	}
	if o.Database == "" {
		o.Database = "ledger"
	}
	if o.Port < 0 || o.Port > 65535 {
		return o, fmt.Errorf("localpg: Options.Port %d is out of range: use 1-65535, or 0 to pick a free port", o.Port)
	}
	// initdb reads the password from the first line of a file.
	if strings.ContainsAny(o.Password, "\r\n\x00") {
		return o, errors.New("localpg: Options.Password contains a line break or NUL byte, which PostgreSQL cannot store: choose another password")
	}
	for name := range o.Settings {
		if slices.Contains(managedSettings, strings.ToLower(name)) {
			return o, fmt.Errorf("localpg: Options.Settings may not set %q because localpg manages it: use Options.Port and Options.Dir instead", name)
		}
	}
	o.Settings = maps.Clone(o.Settings) // the caller may reuse its map
	return o, nil
}

func (s *Server) logf(format string, args ...any) {
	if s.opts.Logf == nil {
		return
	}
	prefix := "localpg: "
	if s.opts.name != "" {
		prefix = "localpg " + s.opts.name + ": "
	}
	s.opts.Logf(prefix+format, args...)
}

func (s *Server) start(ctx context.Context) error {
	if err := s.prepareDir(); err != nil {
		return err
	}
	if err := s.initdb(ctx); err != nil {
		return err
	}
	if err := s.writeHBA(); err != nil {
		return err
	}
	s.port = s.opts.Port
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.run(ctx, s.port == 0, false); err != nil {
		return err
	}
	if err := s.createDatabase(ctx); err != nil {
		return errors.Join(err, s.killLocked())
	}
	return nil
}

func (s *Server) prepareDir() error {
	dir := s.opts.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "shardgate-pg-")
		if err != nil {
			return fmt.Errorf("localpg: creating a temp dir: %w", err)
		}
		dir, s.tempDir = d, true
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("localpg: creating Options.Dir: %w", err)
	}
	// Resolve symlinks so that the traversal check below walks the real path.
	abs, err := filepath.Abs(dir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		if s.tempDir {
			s.dir = dir // so that Start removes it
		}
		return fmt.Errorf("localpg: resolving Options.Dir %s: %w", dir, err)
	}
	s.dir = abs
	s.dataDir = filepath.Join(abs, "data")
	s.logPath = filepath.Join(abs, "postgres.log")
	// The socket name is .s.PGSQL.<port>; budget for a five-digit port.
	if len(abs)+len("/.s.PGSQL.65535") <= maxSocketPath {
		s.sockDir = abs
	} else {
		s.logf("%s is too long a path for a unix socket; the server listens on TCP only", abs)
	}
	// postgres writes its socket and lock files into Dir.
	if err := s.acct.chown(abs); err != nil {
		return err
	}
	return s.acct.ensureTraversable(abs, s.logf)
}

// initdb creates the data directory unless one is already there.
func (s *Server) initdb(ctx context.Context) error {
	if _, err := os.Stat(filepath.Join(s.dataDir, "PG_VERSION")); err == nil {
		s.reused = true
		s.logf("reusing data directory %s", s.dataDir)
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("localpg: checking for a data directory in %s: %w", s.dataDir, err)
	}
	switch entries, err := os.ReadDir(s.dataDir); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("localpg: reading %s: %w", s.dataDir, err)
	case len(entries) > 0:
		return fmt.Errorf("localpg: %s is not empty but has no PG_VERSION, so it is not a PostgreSQL data directory: empty it or choose another Options.Dir", s.dataDir)
	}

	// initdb builds the cluster beside its final place and it is renamed into
	// place only when complete: an initdb killed half-way (ctx ended) would
	// otherwise leave a directory with PG_VERSION that a later Start would
	// take for a usable cluster. A leftover from such a run is discarded.
	building := s.dataDir + ".initdb"
	if err := os.RemoveAll(building); err != nil {
		return fmt.Errorf("localpg: removing an unfinished initdb: %w", err)
	}
	defer os.RemoveAll(building) // a no-op once renamed

	// C locale: fast, present on every machine, and it keeps server messages
	// in English so that bind failures can be recognized.
	args := []string{"-D", building, "-U", s.opts.User, "--encoding=UTF8", "--locale=C", "--auth-local=trust"}
	if s.opts.Password != "" {
		pwfile := filepath.Join(s.dir, ".initdb-password")
		if err := os.WriteFile(pwfile, []byte(s.opts.Password+"\n"), 0o600); err != nil {
			return fmt.Errorf("localpg: writing initdb's password file: %w", err)
		}
		defer os.Remove(pwfile)
		if err := s.acct.chown(pwfile); err != nil {
			return err
		}
		args = append(args, "--pwfile="+pwfile, "--auth-host=scram-sha-256")
	} else {
		args = append(args, "--auth-host=trust")
	}
	if !s.opts.Durable {
		args = append(args, "--no-sync")
	}
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, "initdb"), args...)
	s.prepareCmd(cmd)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := spawn(cmd)
	if err == nil {
		err = cmd.Wait()
	}
	if err != nil {
		return fmt.Errorf("localpg: initdb %s failed: %w; its output ends with:\n%s", s.dataDir, err, lastLines(out.String()))
	}
	// rename(2) also replaces an empty directory that the caller created.
	if err := os.Rename(building, s.dataDir); err != nil {
		return fmt.Errorf("localpg: moving the new cluster into place: %w", err)
	}
	s.logf("initialized %s in %v", s.dataDir, time.Since(start).Round(time.Millisecond))
	return nil
}

// writeHBA rewrites pg_hba.conf on every start so that it always matches
// Options.Password.
func (s *Server) writeHBA() error {
	method := "trust"
	if s.opts.Password != "" {
		method = "scram-sha-256"
	}
	hba := "# Written by shardgate/localpg at every start; edits are overwritten.\n" +
		"local all all trust\n" +
		"host  all all 127.0.0.1/32 " + method + "\n"
	path := filepath.Join(s.dataDir, "pg_hba.conf")
	if err := os.WriteFile(path, []byte(hba), 0o600); err != nil {
		return fmt.Errorf("localpg: writing %s: %w", path, err)
	}
	return s.acct.chown(path)
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

func (s *Server) createDatabase(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, s.dsn(s.port, "postgres"))
	if err != nil {
		return fmt.Errorf("localpg: connecting to create database %q: %w", s.opts.Database, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", s.opts.Database).Scan(&exists); err != nil {
		return fmt.Errorf("localpg: checking for database %q: %w", s.opts.Database, err)
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{s.opts.Database}.Sanitize()); err != nil {
		return fmt.Errorf("localpg: creating database %q: %w", s.opts.Database, err)
	}
	s.logf("created database %q", s.opts.Database)
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

func (s *Server) dsn(port int, database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(s.opts.User),
		Host:     "127.0.0.1:" + strconv.Itoa(port),
		Path:     "/" + database,
		RawQuery: "sslmode=disable",
	}
	if s.opts.Password != "" {
		u.User = url.UserPassword(s.opts.User, s.opts.Password)
	}
	return u.String()
}

// DSN returns a connection URL for Options.Database:
// postgres://user[:password]@127.0.0.1:port/database?sslmode=disable.
// It contains the password, so don't log it.
func (s *Server) DSN() string { return s.dsn(s.port, s.opts.Database) }

// Port returns the TCP port, which stays the same across Stop and Restart.
func (s *Server) Port() int { return s.port }

// Dir returns the directory holding the data directory, socket and log.
func (s *Server) Dir() string { return s.dir }

// LogPath returns the server log file.
func (s *Server) LogPath() string { return s.logPath }

// PID returns the postmaster's process id, or 0 while the server is not
// running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.running(); p != nil {
		return p.pid()
	}
	return 0
}

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

// StartCluster starts n servers in parallel, named shard-0 … shard-<n-1>, and
// returns them in that order. Each gets its own copy of opts, with Dir set to
// opts.Dir/shard-i when opts.Dir is set (else its own temp dir) and Port set
// to opts.Port+i when opts.Port is set (else a free port). If any fails,
// StartCluster closes the ones that started and returns every failure.
func StartCluster(ctx context.Context, n int, opts Options) ([]*Server, error) {
	if n < 1 {
		return nil, fmt.Errorf("localpg: StartCluster needs at least one server, got n=%d", n)
	}
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		o := opts
		o.name = fmt.Sprintf("shard-%d", i)
		if opts.Dir != "" {
			o.Dir = filepath.Join(opts.Dir, o.name)
		}
		if opts.Port != 0 {
			o.Port = opts.Port + i
		}
		wg.Go(func() {
			s, err := Start(ctx, o)
			if err != nil {
				err = fmt.Errorf("%s: %w", o.name, err)
			}
			servers[i], errs[i] = s, err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, s := range servers {
			if s != nil {
				err = errors.Join(err, s.Close())
			}
		}
		return nil, err
	}
	return servers, nil
}
