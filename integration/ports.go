package integration

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// ports hands out loopback ports for servers a test starts later by
// number (a gateway process's --listen, a nats-server's configuration).
// Asking the kernel for port 0 and closing the listener is a race: the
// port goes back to the ephemeral range, which every port-0 listener and
// every outgoing connection on the machine draws from. These ports come
// from below that range instead, are checked free on the address they are
// for, and are never handed out twice by one test process; parallel test
// processes start at random places of the range.
var ports struct {
	mu   sync.Mutex
	next int
	lo   int
	hi   int
	used map[int]bool
}

// freePort returns a TCP port free on 127.0.0.1.
func FreePort(t testing.TB) int { return FreePortOn(t, "127.0.0.1") }

// freePortOn returns a TCP port free on ip.
func FreePortOn(t testing.TB, ip string) int {
	t.Helper()
	ports.mu.Lock()
	defer ports.mu.Unlock()
	if ports.used == nil {
		ports.lo, ports.hi = portRange()
		ports.next = ports.lo + rand.IntN(ports.hi-ports.lo)
		ports.used = map[int]bool{}
	}
	for range ports.hi - ports.lo {
		p := ports.next
		if ports.next++; ports.next >= ports.hi {
			ports.next = ports.lo
		}
		if ports.used[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		ports.used[p] = true
		return p
	}
	t.Fatalf("no free TCP port on %s in %d-%d", ip, ports.lo, ports.hi)
	return 0
}

// portRange is the ports below the kernel's ephemeral range (Linux's
// default 32768-60999 when it cannot be read), at most 12,000 of them and
// none below 10000.
func portRange() (lo, hi int) {
	hi = 32768
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 11000 {
				hi = n
			}
		}
	}
	return max(10000, hi-12000), hi
}
