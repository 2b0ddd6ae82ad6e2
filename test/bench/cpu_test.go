package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/shardgate/shardgate/internal/localpg"
)

// cpuTime is CPU time (user and system) spent by this process (the routers, the peer and the load
// generator) and by the benchmark's PostgreSQL servers (each postmaster and every backend,
// those that exited included): where a phase's time went, on a machine whose cores all of them
// share.
type cpuTime struct{ self, pg time.Duration }

func (c cpuTime) minus(o cpuTime) cpuTime { return cpuTime{c.self - o.self, c.pg - o.pg} }
func (c cpuTime) plus(o cpuTime) cpuTime  { return cpuTime{c.self + o.self, c.pg + o.pg} }

// clockTick is the unit of /proc's times (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// cpuNow reads the CPU time spent so far.
func (f *fixture) cpuNow() (cpuTime, error) {
	var c cpuTime
	self, err := procStat("self")
	if err != nil {
		return c, err
	}
	c.self = self.own
	children := map[int]bool{}
	for _, s := range []*localpg.Server{f.pg, f.pg2} {
		pid, err := postmasterPID(s)
		if err != nil {
			return c, err
		}
		st, err := procStat(strconv.Itoa(pid))
		if err != nil {
			return c, err
		}
		c.pg += st.own + st.reaped
		children[pid] = true
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return c, err
	}
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		st, err := procStat(p.Name())
		if err != nil || !children[st.ppid] {
			continue // gone meanwhile, or not a backend of ours
		}
		c.pg += st.own
	}
	return c, nil
}

// postmasterPID reads s's postmaster's process id from its data directory.
func postmasterPID(s *localpg.Server) (int, error) {
	b, err := os.ReadFile(filepath.Join(s.Dir(), "data", "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}

// stat is what cpuNow needs of /proc/PID/stat: the parent, the process's own CPU time, and that
// of its children it has reaped.
type stat struct {
	ppid        int
	own, reaped time.Duration
}

func procStat(pid string) (stat, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return stat{}, err
	}
	// The command name, in parentheses, may hold spaces: the fields after it are what counts.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return stat{}, fmt.Errorf("/proc/%s/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return stat{}, fmt.Errorf("/proc/%s/stat: %d fields after the command name", pid, len(f))
	}
	// f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14..17.
	n := make([]int64, 5)
	for j, k := range []int{1, 11, 12, 13, 14} {
		if n[j], err = strconv.ParseInt(f[k], 10, 64); err != nil {
			return stat{}, fmt.Errorf("/proc/%s/stat: %w", pid, err)
		}
	}
	return stat{ppid: int(n[0]), own: time.Duration(n[1]+n[2]) * clockTick, reaped: time.Duration(n[3]+n[4]) * clockTick}, nil
}
