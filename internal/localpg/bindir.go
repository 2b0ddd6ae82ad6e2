package localpg

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// BinEnv names the environment variable that overrides where BinDir looks for
// the PostgreSQL server binaries.
const BinEnv = "SHARDGATE_PG_BIN"

// debianBinGlob matches the per-version server directories of Debian's
// postgresql-NN packages, which are not on PATH.
const debianBinGlob = "/usr/lib/postgresql/*/bin"

// BinDir locates the PostgreSQL server binaries (initdb and postgres):
// $SHARDGATE_PG_BIN if set, else `pg_config --bindir` if that directory has
// initdb and postgres, else the newest /usr/lib/postgresql/*/bin.
//
// $SHARDGATE_PG_BIN is taken as final: if it is set but wrong, BinDir reports
// that instead of silently using another installation.
func BinDir() (string, error) {
	if dir := os.Getenv(BinEnv); dir != "" {
		if err := hasServerBinaries(dir); err != nil {
			return "", fmt.Errorf("localpg: %s=%s: %w", BinEnv, dir, err)
		}
		return dir, nil
	}
	// pg_config can belong to a client-only install (libpq-dev), so its answer
	// counts only if the server binaries are really there.
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasServerBinaries(dir) == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob(debianBinGlob) // the pattern is constant and valid
	slices.SortFunc(dirs, func(a, b string) int { return compareVersions(b, a) })
	for _, dir := range dirs {
		if hasServerBinaries(dir) == nil {
			return dir, nil
		}
	}
	return "", fmt.Errorf("localpg: no PostgreSQL server binaries (initdb, postgres) found via pg_config --bindir or in %s: "+
		"install them (apt-get install postgresql-15) or set %s to the directory that holds them", debianBinGlob, BinEnv)
}

func hasServerBinaries(dir string) error {
	var errs []error
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		switch {
		case err != nil:
			errs = append(errs, err)
		case fi.IsDir() || fi.Mode().Perm()&0o111 == 0:
			errs = append(errs, fmt.Errorf("%s is not an executable file", filepath.Join(dir, name)))
		}
	}
	return errors.Join(errs...)
}

// compareVersions orders /usr/lib/postgresql/<version>/bin paths by version
// numerically, so that 15 sorts above 9.6.
func compareVersions(a, b string) int {
	va := strings.Split(filepath.Base(filepath.Dir(a)), ".")
	vb := strings.Split(filepath.Base(filepath.Dir(b)), ".")
	for i := range max(len(va), len(vb)) {
		var na, nb int
		if i < len(va) {
			na, _ = strconv.Atoi(va[i])
		}
		if i < len(vb) {
			nb, _ = strconv.Atoi(vb[i])
		}
		if na != nb {
			return na - nb
		}
	}
	return strings.Compare(a, b)
}
