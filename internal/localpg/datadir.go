//go:build linux

package localpg

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// maxSocketPath is the longest unix socket path the kernel accepts
// (sizeof(sun_path) - 1).
const maxSocketPath = 107

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
