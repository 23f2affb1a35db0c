package integration

import (
	"net"
	"testing"
)

// TestFreePorts: ports handed out are distinct, free, and outside the
// ephemeral range that port-0 listeners use.
func TestFreePorts(t *testing.T) {
	lo, hi := portRange()
	seen := map[int]bool{}
	for range 50 {
		p := freePort(t)
		if p < lo || p >= hi || seen[p] {
			t.Fatalf("port %d: seen before %v, range %d-%d", p, seen[p], lo, hi)
		}
		seen[p] = true
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if p := ln.Addr().(*net.TCPAddr).Port; p >= lo && p < hi {
		t.Errorf("the kernel gave port %d to a port-0 listener, inside the range %d-%d freePort uses", p, lo, hi)
	}
}
