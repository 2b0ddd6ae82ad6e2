//go:build linux

package localpg

import (
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// An account is the unprivileged user that initdb and postgres run as when
// this process is root, since both refuse to run as root.
type account struct {
	name     string
	uid, gid uint32
}

// serverAccount returns the account to run PostgreSQL as, or nil when this
// process isn't root and PostgreSQL simply runs as the current user.
func serverAccount() (*account, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err := strconv.ParseUint(u.Uid, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("localpg: user %s has a non-numeric uid %q: %w", name, u.Uid, err)
		}
		gid, err := strconv.ParseUint(u.Gid, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("localpg: user %s has a non-numeric gid %q: %w", name, u.Gid, err)
		}
		return &account{name: name, uid: uint32(uid), gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("localpg: running as root, and PostgreSQL refuses to, but there is neither a postgres nor a nobody user to run it as: " +
		"install postgresql (which creates the postgres user) or run as a non-root user")
}

// credential switches a child to the account, dropping root's supplementary
// groups too (an empty Groups clears them).
func (a *account) credential() *syscall.Credential {
	if a == nil {
		return nil
	}
	return &syscall.Credential{Uid: a.uid, Gid: a.gid, Groups: []uint32{}}
}

// chown gives path to the account; a no-op when not running as root.
func (a *account) chown(path string) error {
	if a == nil {
		return nil
	}
	if err := os.Chown(path, int(a.uid), int(a.gid)); err != nil {
		return fmt.Errorf("localpg: giving %s to user %s: %w", path, a.name, err)
	}
	return nil
}

// ensureTraversable grants search permission (o+x: enter, not list) on each
// ancestor of dir that the account couldn't otherwise pass through, because
// postgres, running as the account, must reach its data directory, and
// t.TempDir() and os.MkdirTemp create 0700 root-owned directories. Nothing is
// changed for directories the account can already traverse.
func (a *account) ensureTraversable(dir string, logf func(string, ...any)) error {
	if a == nil {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("localpg: checking that user %s can reach %s: %w", a.name, dir, err)
		}
		if !a.canSearch(fi) {
			keep := fi.Mode() & (fs.ModePerm | fs.ModeSticky | fs.ModeSetgid | fs.ModeSetuid)
			if err := os.Chmod(d, keep|0o001); err != nil {
				return fmt.Errorf("localpg: user %s cannot enter %s and granting it o+x failed: %w", a.name, d, err)
			}
			logf("granted o+x on %s so that user %s can reach %s", d, a.name, dir)
		}
		if filepath.Dir(d) == d {
			return nil
		}
	}
}

// canSearch applies the permission bits the way the kernel does: only the
// owner bits for the owner, only the group bits for the group.
func (a *account) canSearch(fi fs.FileInfo) bool {
	perm := fi.Mode().Perm()
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !ok:
		return perm&0o001 != 0
	case st.Uid == a.uid:
		return perm&0o100 != 0
	case st.Gid == a.gid:
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}
