//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// devLockFile, in a sandbox's directory, is held (flock) by the `router dev` running it.
const devLockFile = "router-dev.lock"

// lockSandbox takes the sandbox in dir for this process, or says that another `router dev`
// holds it: two would start the same PostgreSQL data directories. The lock goes with the
// process, however it ends; unlock releases it sooner.
func lockSandbox(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, devLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if b, _ := os.ReadFile(path); len(strings.TrimSpace(string(b))) > 0 {
				holder = "process " + strings.TrimSpace(string(b))
			}
			return nil, fmt.Errorf("dev: another router dev (%s) is running the sandbox in %s; stop it (Ctrl-C where it runs), or start a separate sandbox with another --dir", holder, dir)
		}
		return nil, fmt.Errorf("dev: locking the sandbox in %s: %w", dir, err)
	}
	f.Truncate(0)                                        //nolint:errcheck // the pid is only a hint for the message above
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) //nolint:errcheck // same
	return func() { f.Close() }, nil
}
