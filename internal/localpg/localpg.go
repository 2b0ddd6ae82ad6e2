//go:build linux

package localpg

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
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
