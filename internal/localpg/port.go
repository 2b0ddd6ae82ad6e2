package localpg

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowestPort is the bottom of the range FreePort draws from, clear of
// privileged ports and the usual well-known service ports.
const lowestPort = 10000

// FreePort returns a TCP port on 127.0.0.1 that nothing is listening on.
//
// It prefers ports below the kernel's ephemeral range over asking for port 0:
// an ephemeral port can be handed to some client's outgoing connection, and
// then sit in TIME_WAIT for a minute, while a stopped server waits to Restart
// on it; ports below the range are taken only by explicit binds. Whichever
// way, another process can still take the port before postgres binds it, so
// callers retry on a bind failure.
func FreePort() (int, error) {
	if top := ephemeralLow() - 1; top-lowestPort >= 1000 {
		for range 20 {
			port := lowestPort + rand.IntN(top-lowestPort+1)
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("localpg: finding a free port on 127.0.0.1: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow returns the first port of the kernel's ephemeral range, or 0
// when it can't be read (which makes FreePort fall back to port 0).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 {
		return 0
	}
	low, _ := strconv.Atoi(fields[0])
	return low
}
