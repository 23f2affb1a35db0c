//go:build linux

package integration

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NetNS is a network namespace joined to this one by a veth pair, with
// its own addresses: a machine of its own, as far as the network goes.
// Processes started with command reach the test's side only through the
// veth link, at HostIP.
type NetNS struct {
	t              testing.TB
	Name           string
	HostIf, NSIf   string // the veth ends: in this namespace, in the new one
	HostIP, NSIP   string // their addresses, one /30 between them
	commandTimeout time.Duration
}

// newNetNS makes a network namespace with a veth pair to this one, named
// and addressed uniquely so parallel runs do not clash, and removes both
// with the test, whatever happens. It skips the test where namespaces
// cannot be made (not root, no ip command, a sandbox without them).
func NewNetNS(t testing.TB) *NetNS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip command (iproute2) to make a network namespace with")
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	id := fmt.Sprintf("%08x", binary.BigEndian.Uint32(r[:]))[:7]
	ns := &NetNS{t: t, Name: fmt.Sprintf("%s%d-%s", nsPrefix, os.Getpid(), id), HostIf: "fmh" + id, NSIf: "fmn" + id, commandTimeout: 20 * time.Second}
	ns.sweep()
	if out, err := ns.IP("netns", "add", ns.Name); err != nil {
		t.Skipf("cannot make a network namespace here (%v): %s", err, out)
	}
	// Registered before the links exist, so a half-made setup goes too.
	t.Cleanup(ns.remove)
	var err error
	if ns.HostIP, ns.NSIP, err = freeSubnet(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"link", "add", ns.HostIf, "type", "veth", "peer", "name", ns.NSIf, "netns", ns.Name},
		{"addr", "add", ns.HostIP + "/30", "dev", ns.HostIf},
		{"link", "set", ns.HostIf, "up"},
		{"-n", ns.Name, "addr", "add", ns.NSIP + "/30", "dev", ns.NSIf},
		{"-n", ns.Name, "link", "set", ns.NSIf, "up"},
		{"-n", ns.Name, "link", "set", "lo", "up"},
	} {
		if out, err := ns.IP(args...); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return ns
}

// nsPrefix starts the names of the namespaces tests make, followed by
// the test process's pid.
const nsPrefix = "fleetmcp-test-"

// sweep removes the namespaces of test processes that are gone (a test
// binary killed by its timeout runs no cleanup); those of live ones,
// parallel runs, are left alone.
func (ns *NetNS) sweep() {
	out, err := ns.IP("netns", "list")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, nsPrefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		if out, err := ns.IP("netns", "del", name); err != nil {
			ns.t.Logf("remove stale namespace %s: %v: %s", name, err, out)
		} else {
			ns.t.Logf("removed stale namespace %s (its test process %d is gone)", name, pid)
		}
	}
}

// IP runs the ip command, bounded in time.
func (ns *NetNS) IP(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ns.commandTimeout)
	defer cancel()
	return exec.CommandContext(ctx, "ip", args...).CombinedOutput()
}

// remove deletes the namespace and the veth pair (deleting either end
// deletes both; the namespace's end goes with the namespace).
func (ns *NetNS) remove() {
	if out, err := ns.IP("link", "del", ns.HostIf); err != nil && !strings.Contains(string(out), "Cannot find device") {
		ns.t.Logf("ip link del %s: %v: %s", ns.HostIf, err, out)
	}
	if out, err := ns.IP("netns", "del", ns.Name); err != nil {
		ns.t.Errorf("ip netns del %s: %v: %s", ns.Name, err, out)
	}
}

// Command returns a command that runs name with args inside the
// namespace (ip netns exec execs it: the process is the command itself,
// and signals reach it).
func (ns *NetNS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns.Name, name}, args...)...)
}

// freeSubnet picks a /30 in 10.200.0.0/13 that no interface of this
// machine is in, and returns its two host addresses.
func freeSubnet() (first, second string, err error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", "", err
	}
	for range 20 {
		var r [3]byte
		_, _ = rand.Read(r[:])
		a, b, y := 200+int(r[0]%8), int(r[1]), int(r[2]%64)*4
		_, block, _ := net.ParseCIDR(fmt.Sprintf("10.%d.%d.%d/30", a, b, y))
		used := false
		for _, addr := range addrs {
			if n, ok := addr.(*net.IPNet); ok && (block.Contains(n.IP) || n.Contains(block.IP)) {
				used = true
			}
		}
		if !used {
			return fmt.Sprintf("10.%d.%d.%d", a, b, y+1), fmt.Sprintf("10.%d.%d.%d", a, b, y+2), nil
		}
	}
	return "", "", errors.New("found no free /30 in 10.200.0.0/13")
}

// AddLink joins the namespace to this one by a second veth pair, on a
// /30 of its own, and returns its two addresses (this side's, the
// namespace's): traffic to either end's address takes its own link, so
// that one link can go down while the other carries on.
func (ns *NetNS) AddLink() (hostIP, nsIP string) {
	ns.t.Helper()
	id := strings.TrimPrefix(ns.HostIf, "fmh")
	hostIf, nsIf := "fmb"+id, "fmc"+id
	var err error
	if hostIP, nsIP, err = freeSubnet(); err != nil {
		ns.t.Fatal(err)
	}
	ns.t.Cleanup(func() {
		if out, err := ns.IP("link", "del", hostIf); err != nil && !strings.Contains(string(out), "Cannot find device") {
			ns.t.Logf("ip link del %s: %v: %s", hostIf, err, out)
		}
	})
	for _, args := range [][]string{
		{"link", "add", hostIf, "type", "veth", "peer", "name", nsIf, "netns", ns.Name},
		{"addr", "add", hostIP + "/30", "dev", hostIf},
		{"link", "set", hostIf, "up"},
		{"-n", ns.Name, "addr", "add", nsIP + "/30", "dev", nsIf},
		{"-n", ns.Name, "link", "set", nsIf, "up"},
	} {
		if out, err := ns.IP(args...); err != nil {
			ns.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return hostIP, nsIP
}

// SetLink sets the namespace's end of the first link down or up. Down,
// the namespace has no route to this side's address (it has no other),
// and this side's route to the namespace's address leads into a link
// without carrier: packets either way are dropped here, none leaves the
// machine.
func (ns *NetNS) SetLink(up bool) {
	ns.t.Helper()
	state := "down"
	if up {
		state = "up"
	}
	if out, err := ns.IP("-n", ns.Name, "link", "set", ns.NSIf, state); err != nil {
		ns.t.Fatalf("ip -n %s link set %s %s: %v: %s", ns.Name, ns.NSIf, state, err, out)
	}
}
