//go:build linux

package localpg

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The parent-death test re-runs this test binary as a helper that starts a
// server and is then killed; these variables tell it what to do.
const (
	helperModeEnv = "LOCALPG_TEST_HELPER_MODE" // "running" or "paused"
	helperDirEnv  = "LOCALPG_TEST_HELPER_DIR"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperModeEnv); mode != "" {
		os.Exit(runHelper(mode))
	}
	os.Exit(m.Run())
}

// runHelper starts a server with one client connection, optionally pauses
// it, prints the pids that must not outlive this process, and waits to be
// killed.
func runHelper(mode string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{Dir: os.Getenv(helperDirEnv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := pgx.Connect(ctx, s.DSN()); err != nil { // gives the postmaster a client backend
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if mode == "paused" {
		if err := s.Pause(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	kids, err := childPIDs(s.PID())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("pids", s.PID(), strings.Trim(fmt.Sprint(kids), "[]"))
	time.Sleep(time.Minute) // the test kills this process long before
	return 1
}

// requireBinaries skips the test when the PostgreSQL server binaries are
// missing, except in CI, where a missing install must fail loudly rather
// than turn the suite green by skipping everything.
func requireBinaries(t *testing.T) {
	t.Helper()
	if _, err := BinDir(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so PostgreSQL server binaries are required: %v", err)
		}
		t.Skipf("skipping: PostgreSQL server binaries not found: %v", err)
	}
}

// testContext bounds a test generously: the machine may be busy with other
// test binaries, and initdb alone needs about a CPU-second.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func startServer(t *testing.T, opts Options) *Server {
	t.Helper()
	requireBinaries(t)
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	s, err := Start(testContext(t), opts)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func connect(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func queryInt(t *testing.T, ctx context.Context, conn *pgx.Conn, sql string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// requireExited fails unless every pid terminates within a few seconds.
func requireExited(t *testing.T, pids ...int) {
	t.Helper()
	alive := func() []int {
		return slices.DeleteFunc(slices.Clone(pids), exited)
	}
	if !waitFor(10*time.Second, func() bool { return len(alive()) == 0 }) {
		t.Fatalf("processes %v still exist", alive())
	}
}

func TestStartAndQuery(t *testing.T) {
	t.Parallel()
	s := startServer(t, Options{})
	ctx := testContext(t)

	if want := fmt.Sprintf("postgres://shardgate@127.0.0.1:%d/ledger?sslmode=disable", s.Port()); s.DSN() != want {
		t.Errorf("DSN() = %q, want %q", s.DSN(), want)
	}
	conn := connect(t, ctx, s.DSN())
	var db, user string
	if err := conn.QueryRow(ctx, "SELECT current_database(), current_user").Scan(&db, &user); err != nil {
		t.Fatal(err)
	}
	if db != "ledger" || user != "shardgate" {
		t.Errorf("connected to database %q as %q, want ledger as shardgate", db, user)
	}
	for setting, want := range map[string]string{
		"fsync":              "off",
		"full_page_writes":   "off",
		"synchronous_commit": "on",
		"shared_buffers":     "32MB",
		"max_connections":    "100",
		"listen_addresses":   "127.0.0.1",
	} {
		var got string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", setting, got, want)
		}
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), ".s.PGSQL."+strconv.Itoa(s.Port()))); err != nil {
		t.Errorf("unix socket not in Dir: %v", err)
	}
}

func TestStopRestartKeepsDataAndPort(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "pg")
	s := startServer(t, Options{Dir: dir})
	ctx := testContext(t)

	conn := connect(t, ctx, s.DSN())
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	port, pid := s.Port(), s.PID()

	if err := s.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	requireExited(t, pid)
	if s.PID() != 0 {
		t.Errorf("PID() = %d after Stop, want 0", s.PID())
	}
	if err := s.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if c, err := pgx.Connect(ctx, s.DSN()); err == nil {
		c.Close(ctx)
		t.Fatal("connected to a stopped server")
	}

	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if s.Port() != port {
		t.Errorf("Port() = %d after Restart, want %d", s.Port(), port)
	}
	if got := queryInt(t, ctx, connect(t, ctx, s.DSN()), "SELECT v FROM kept"); got != 42 {
		t.Errorf("after Restart got %d, want 42", got)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	// Start on an explicit port that is taken fails, naming the port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	busy := l.Addr().(*net.TCPAddr).Port
	_, err = Start(ctx, Options{Dir: dir, Port: busy, Logf: t.Logf})
	l.Close()
	if !errors.Is(err, errPortInUse) || !strings.Contains(err.Error(), strconv.Itoa(busy)) {
		t.Errorf("Start on busy port %d = %v, want a port-in-use error naming it", busy, err)
	}

	// A new Start on the same Dir reuses the data instead of running initdb.
	s2 := startServer(t, Options{Dir: dir})
	if got := queryInt(t, ctx, connect(t, ctx, s2.DSN()), "SELECT v FROM kept"); got != 42 {
		t.Errorf("after Start on the same Dir got %d, want 42", got)
	}
}

func TestKillRestartRecovers(t *testing.T) {
	t.Parallel()
	s := startServer(t, Options{})
	ctx := testContext(t)

	conn := connect(t, ctx, s.DSN())
	if _, err := conn.Exec(ctx, "CREATE TABLE acked (v int); INSERT INTO acked VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	pm := s.PID()
	kids, err := childPIDs(pm)
	if err != nil || len(kids) == 0 {
		t.Fatalf("childPIDs(%d) = %v, %v; want the backends", pm, kids, err)
	}

	if err := s.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	requireExited(t, append(kids, pm)...)

	if err := s.Restart(ctx); err != nil {
		t.Fatalf("Restart after Kill: %v", err)
	}
	if got := queryInt(t, ctx, connect(t, ctx, s.DSN()), "SELECT v FROM acked"); got != 7 {
		t.Errorf("after crash recovery got %d, want the acknowledged 7", got)
	}
	log, err := os.ReadFile(s.LogPath())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "not properly shut down") {
		t.Errorf("server log shows no crash recovery:\n%s", log)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := startServer(t, Options{})
	ctx := testContext(t)
	conn := connect(t, ctx, s.DSN())

	if err := s.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := s.Pause(); err != nil {
		t.Fatalf("second Pause: %v", err)
	}
	requireTimeout := func(what string, do func(context.Context) error) {
		t.Helper()
		qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := do(qctx)
		if err == nil || !(pgconn.Timeout(err) || errors.Is(err, context.DeadlineExceeded)) {
			t.Errorf("%s on a paused server: got %v, want a timeout", what, err)
		}
		if elapsed := time.Since(start); elapsed > 5*time.Second {
			t.Errorf("%s took %v to give up, want about 500ms", what, elapsed)
		}
	}
	requireTimeout("query on an open connection", func(ctx context.Context) error {
		_, err := conn.Exec(ctx, "SELECT 1")
		return err
	})
	requireTimeout("new connection", func(ctx context.Context) error {
		c, err := pgx.Connect(ctx, s.DSN())
		if err == nil {
			c.Close(ctx)
		}
		return err
	})

	if err := s.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if got := queryInt(t, ctx, connect(t, ctx, s.DSN()), "SELECT 1"); got != 1 {
		t.Errorf("after Resume got %d, want 1", got)
	}

	// Stop must get through a pause on its own.
	if err := s.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	pid := s.PID()
	if err := s.Stop(ctx); err != nil {
		t.Fatalf("Stop while paused: %v", err)
	}
	requireExited(t, pid)
	if err := s.Pause(); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Pause after Stop = %v, want ErrNotRunning", err)
	}
}

func TestPassword(t *testing.T) {
	t.Parallel()
	const password = "s3cret p@ss/wörd:%"
	var logged strings.Builder
	var mu sync.Mutex
	s := startServer(t, Options{Password: password, Logf: func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(&logged, format+"\n", args...)
		t.Logf(format, args...)
	}})
	ctx := testContext(t)

	if got := queryInt(t, ctx, connect(t, ctx, s.DSN()), "SELECT 1"); got != 1 {
		t.Errorf("got %d, want 1", got)
	}
	u, err := url.Parse(s.DSN())
	if err != nil {
		t.Fatal(err)
	}
	if pw, _ := u.User.Password(); pw != password {
		t.Errorf("DSN carries password %q, want %q", pw, password)
	}
	for name, user := range map[string]*url.Userinfo{
		"wrong password": url.UserPassword("shardgate", "wrong"),
		"no password":    url.User("shardgate"),
	} {
		u.User = user
		c, err := pgx.Connect(ctx, u.String())
		if err == nil {
			c.Close(ctx)
			t.Errorf("%s: connected, want authentication failure", name)
			continue
		}
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "28P01" {
			t.Errorf("%s: got %v, want SQLSTATE 28P01 (invalid_password)", name, err)
		}
	}

	// A failing start includes the server log in its error: no password in
	// it. Reusing the stopped server's data saves an initdb.
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = Start(ctx, Options{Dir: s.Dir(), Password: password, Settings: map[string]string{"max_connections": "lots"}})
	if err == nil || !strings.Contains(err.Error(), "max_connections") {
		t.Fatalf("Start with a bad setting = %v, want an error quoting the server log", err)
	}
	serverLog, err2 := os.ReadFile(s.LogPath())
	if err2 != nil {
		t.Fatal(err2)
	}
	mu.Lock()
	defer mu.Unlock()
	for what, text := range map[string]string{"error": err.Error(), "Logf output": logged.String(), "server log": string(serverLog)} {
		if strings.Contains(text, password) || strings.Contains(text, url.QueryEscape(password)) {
			t.Errorf("%s contains the password", what)
		}
	}
}

func TestStartCluster(t *testing.T) {
	t.Parallel()
	requireBinaries(t)
	ctx := testContext(t)
	base := t.TempDir() // 0700 and root-owned when running as root
	servers, err := StartCluster(ctx, 3, Options{Dir: base, Logf: t.Logf})
	if err != nil {
		t.Fatalf("StartCluster: %v", err)
	}
	t.Cleanup(func() {
		for _, s := range servers {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	realBase, err := filepath.EvalSymlinks(base)
	if err != nil {
		t.Fatal(err)
	}
	ports := map[int]bool{}
	for i, s := range servers {
		ports[s.Port()] = true
		if want := filepath.Join(realBase, fmt.Sprintf("shard-%d", i)); s.Dir() != want {
			t.Errorf("servers[%d].Dir() = %s, want %s", i, s.Dir(), want)
		}
		if got := queryInt(t, ctx, connect(t, ctx, s.DSN()), "SELECT current_setting('port')::int"); got != s.Port() {
			t.Errorf("servers[%d] answers on port %d, want %d", i, got, s.Port())
		}
	}
	if len(ports) != 3 {
		t.Errorf("ports %v, want three distinct ones", ports)
	}
}

func TestCloseRemovesTempDirAndProcesses(t *testing.T) {
	t.Parallel()
	s := startServer(t, Options{})
	ctx := testContext(t)
	connect(t, ctx, s.DSN()) // an open client backend must not hold Close up
	pm := s.PID()
	kids, err := childPIDs(pm)
	if err != nil {
		t.Fatal(err)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat(s.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp dir %s still there after Close (stat: %v)", s.Dir(), err)
	}
	requireExited(t, append(kids, pm)...)
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Restart(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Restart after Close = %v, want ErrClosed", err)
	}
}

// TestParentDeathStopsServer kills a process that started a server and
// checks that the postmaster and its children go away with it, also while
// the server is paused. The modes run one after the other on one Dir, which
// saves an initdb.
func TestParentDeathStopsServer(t *testing.T) {
	t.Parallel()
	requireBinaries(t)
	dir := t.TempDir()
	for i, mode := range []string{"running", "paused"} {
		runs := i + 1
		t.Run(mode, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), helperModeEnv+"="+mode, helperDirEnv+"="+dir)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			})
			line, err := bufio.NewReader(stdout).ReadString('\n')
			if err != nil {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("helper printed no pids (%v); stderr:\n%s", err, stderr.String())
			}
			var pids []int
			for _, f := range strings.Fields(strings.TrimPrefix(line, "pids")) {
				pid, err := strconv.Atoi(f)
				if err != nil {
					t.Fatalf("bad helper output %q", line)
				}
				pids = append(pids, pid)
			}
			if len(pids) < 2 {
				t.Fatalf("helper reported %v, want the postmaster and its children", pids)
			}
			if mode == "paused" {
				if st, err := readStat(pids[0]); err != nil || st.state != 'T' {
					t.Fatalf("postmaster state %q (%v), want T (stopped)", st.state, err)
				}
			}

			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			requireExited(t, pids...)
			// SIGQUIT, the parent-death signal, is an immediate shutdown.
			log, err := os.ReadFile(filepath.Join(dir, "postgres.log"))
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(log), "received immediate shutdown request"); n != runs {
				t.Errorf("server log shows %d immediate shutdowns after %d parent deaths:\n%s", n, runs, log)
			}
		})
	}
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts Options
		want string
	}{
		{"negative port", Options{Port: -1}, "Options.Port -1 is out of range"},
		{"port too high", Options{Port: 65536}, "Options.Port 65536 is out of range"},
		{"password with newline", Options{Password: "a\nb"}, "line break"},
		{"managed setting, any case", Options{Settings: map[string]string{"PORT": "5"}}, `may not set "PORT"`},
		{"socket dir setting", Options{Settings: map[string]string{"unix_socket_directories": "/tmp"}}, "unix_socket_directories"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Start(context.Background(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Start = %v, want an error containing %q", err, tc.want)
			}
			if err != nil && tc.opts.Password != "" && strings.Contains(err.Error(), tc.opts.Password) {
				t.Errorf("error reveals the password: %v", err)
			}
		})
	}
	if _, err := StartCluster(context.Background(), 0, Options{}); err == nil {
		t.Error("StartCluster(0) succeeded, want an error")
	}
}

func TestServerArgs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		opts       Options
		sockDir    string
		want, omit []string
	}{
		{
			name:    "fast defaults",
			sockDir: "/run/a dir,x",
			want: []string{"-D /data", "-c port=5433", "-c listen_addresses=127.0.0.1", "-c fsync=off", "-c full_page_writes=off",
				"-c shared_buffers=32MB", "-c max_connections=100", `-c unix_socket_directories="/run/a dir,x"`},
			omit: []string{"synchronous_commit"},
		},
		{
			name: "durable with overrides",
			opts: Options{Durable: true, Settings: map[string]string{"Max_Connections": "7", "work_mem": "1MB"}},
			want: []string{"-c max_connections=7", "-c work_mem=1MB", "-c unix_socket_directories= "},
			omit: []string{"fsync", "full_page_writes", "max_connections=100"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{opts: tc.opts, dataDir: "/data", sockDir: tc.sockDir}
			args := strings.Join(s.serverArgs(5433), " ") + " "
			for _, w := range tc.want {
				if !strings.Contains(args, w) {
					t.Errorf("args %q lack %q", args, w)
				}
			}
			for _, o := range tc.omit {
				if strings.Contains(args, o) {
					t.Errorf("args %q contain %q", args, o)
				}
			}
		})
	}
}

func TestBinDir(t *testing.T) {
	empty := t.TempDir()
	t.Setenv(BinEnv, empty)
	if _, err := BinDir(); err == nil || !strings.Contains(err.Error(), BinEnv) {
		t.Errorf("BinDir with %s=%s (no binaries) = %v, want an error naming %s", BinEnv, empty, err, BinEnv)
	}
	t.Setenv(BinEnv, "")
	dir, err := BinDir()
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set, so PostgreSQL server binaries are required: %v", err)
		}
		if !strings.Contains(err.Error(), "apt-get install postgresql-15") {
			t.Errorf("BinDir error %q doesn't say how to install", err)
		}
		return
	}
	t.Setenv(BinEnv, dir)
	if got, err := BinDir(); got != dir || err != nil {
		t.Errorf("BinDir with %s=%s = %q, %v", BinEnv, dir, got, err)
	}
}

func TestCompareVersions(t *testing.T) {
	t.Parallel()
	dirs := []string{"/usr/lib/postgresql/9.6/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/13/bin", "/usr/lib/postgresql/16/bin"}
	slices.SortFunc(dirs, func(a, b string) int { return compareVersions(b, a) })
	want := []string{"/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/13/bin", "/usr/lib/postgresql/9.6/bin"}
	if !slices.Equal(dirs, want) {
		t.Errorf("newest first = %v, want %v", dirs, want)
	}
}

func TestStartRefusesNonClusterDataDir(t *testing.T) {
	t.Parallel()
	requireBinaries(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data", "notes.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(testContext(t), Options{Dir: dir})
	if err == nil || !strings.Contains(err.Error(), "not a PostgreSQL data directory") {
		t.Errorf("Start on a data dir holding other files = %v, want a refusal", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "notes.txt")); err != nil {
		t.Errorf("Start touched the foreign file: %v", err)
	}
}
