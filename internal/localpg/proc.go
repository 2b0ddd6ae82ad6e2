//go:build linux

package localpg

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// parentDeathSignal is what the kernel sends a postmaster whose parent (this
// process) dies: SIGQUIT is PostgreSQL's immediate shutdown, which also takes
// down every backend, unlike SIGKILL which would leave them to notice on
// their own.
const parentDeathSignal = syscall.SIGQUIT

var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// spawn starts cmd from one OS thread that stays locked, and so alive, for the
// life of the process.
//
// Linux sends the parent-death signal (SysProcAttr.Pdeathsig) when the
// *thread* that forked the child exits, not the process (go.dev/issue/27505).
// Go threads are pooled: the thread that forked a postmaster can later run a
// goroutine that calls runtime.LockOSThread and exits without unlocking,
// which terminates the thread and would SIGQUIT the postmaster in the middle
// of a test. Forking only from a thread that no goroutine can ever release
// makes the signal mean exactly "this process is gone". The cost is one idle
// thread.
func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked, see above
			for req := range spawnReqs {
				req.done <- req.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	spawnReqs <- spawnReq{cmd: cmd, done: done}
	return <-done
}

type procStat struct {
	state byte // R, S, D, T (stopped), Z (zombie), ...
	ppid  int
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	// The command name (field 2) is in parentheses and may itself contain
	// spaces or parentheses, so parse from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	fields := strings.Fields(string(b[i+1:]))
	if i < 0 || len(fields) < 2 {
		return procStat{}, fmt.Errorf("localpg: unexpected format of /proc/%d/stat", pid)
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return procStat{}, fmt.Errorf("localpg: unexpected parent pid in /proc/%d/stat: %w", pid, err)
	}
	return procStat{state: fields[0][0], ppid: ppid}, nil
}

// childPIDs lists the processes whose parent is pid. Every PostgreSQL child
// calls setsid(), so the postmaster's process group doesn't reach them and
// /proc is the only complete list.
func childPIDs(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("localpg: listing postgres child processes: %w", err)
	}
	var kids []int
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a process
		}
		if st, err := readStat(n); err == nil && st.ppid == pid {
			kids = append(kids, n)
		}
	}
	return kids, nil
}

// exited reports whether pid has terminated. A zombie counts: it has already
// released its memory and shared-memory attachments, and it may never be
// reaped if it was reparented to a container init that doesn't reap.
func exited(pid int) bool {
	st, err := readStat(pid)
	return err != nil || st.state == 'Z' || st.state == 'X'
}

// stopped reports whether pid is stopped by a signal (or no longer running).
func stopped(pid int) bool {
	st, err := readStat(pid)
	return err != nil || st.state == 'T' || st.state == 'Z' || st.state == 'X'
}

// waitFor polls cond until it holds or timeout passes, and reports whether it
// held.
func waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// signalAll sends sig to each pid, ignoring processes that are already gone.
func signalAll(pids []int, sig syscall.Signal) error {
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && err != syscall.ESRCH {
			return fmt.Errorf("localpg: sending %v to pid %d: %w", sig, pid, err)
		}
	}
	return nil
}

// A watchdog guards a paused server against this process dying. A stopped
// process acts on no signal but SIGKILL, so the postmaster would sit on its
// pending parent-death signal, and its stopped backends would stay frozen
// forever. The watchdog is a tiny shell that blocks reading a pipe whose only
// writer is this process; when this process exits, for whatever reason, the
// read sees EOF and the shell sends SIGCONT to the paused processes, after
// which the postmaster acts on its parent-death signal.
type watchdog struct {
	cmd  *exec.Cmd
	pipe *os.File // write end; never written, only held open
	pids []int    // the paused processes, children first
}

// watchdogScript resumes its arguments once stdin reaches EOF.
const watchdogScript = `read _; kill -CONT "$@" 2>/dev/null`

func startWatchdog(pids []int) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("localpg: creating watchdog pipe: %w", err)
	}
	args := []string{"-c", watchdogScript, "localpg-watchdog"}
	for _, pid := range pids {
		args = append(args, strconv.Itoa(pid))
	}
	cmd := exec.Command("/bin/sh", args...)
	cmd.Stdin = r
	// Its own process group, so a Ctrl-C aimed at this process doesn't kill
	// the watchdog before it is needed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	r.Close() // the child holds its own copy
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("localpg: starting pause watchdog: %w", err)
	}
	return &watchdog{cmd: cmd, pipe: w, pids: pids}, nil
}

// disarm ends the watchdog without letting it act, so it can't SIGCONT pids
// that have since been reused by unrelated processes.
func (w *watchdog) disarm() {
	_ = w.cmd.Process.Kill()
	_ = w.cmd.Wait() // "signal: killed" is the expected outcome
	w.pipe.Close()
}
