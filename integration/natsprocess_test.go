package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// natsServerBinary builds nats-server, at the version this module pins,
// once per test binary.
func natsServerBinary(t testing.TB) string { return natsServerCommand.binary(t) }

// natsServerProcess runs a nats-server process configured as
// deploy/nats/README.md tells operators: the include nats-setup wrote
// into setup, taken as it is (its resolver directory relative to the
// server's working directory), with a listen address and JetStream. It
// returns the server's URL; the process is stopped with the test.
func natsServerProcess(t *testing.T, setup string) string {
	return startNATSProcess(t, setup).url()
}

// natsProc is a nats-server process that a test may stop and start again
// on the same address and state.
type natsProc struct {
	t    *testing.T
	bin  string
	dir  string
	addr string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// startNATSProcess is natsServerProcess, returning the process.
func startNATSProcess(t *testing.T, setup string) *natsProc {
	t.Helper()
	p := &natsProc{t: t, bin: natsServerBinary(t), dir: t.TempDir()}
	name := gateway.NATSSetupFiles.ServerConfig
	include, err := os.ReadFile(filepath.Join(setup, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p.dir, name), include, 0o644); err != nil {
		t.Fatal(err)
	}
	p.addr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	conf := fmt.Sprintf("include %s\nlisten: %s\njetstream { store_dir: \"./js\" }\n", name, p.addr)
	if err := os.WriteFile(filepath.Join(p.dir, "nats.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	p.start()
	return p
}

func (p *natsProc) url() string { return "nats://" + p.addr }

// start runs the server and waits until it listens.
func (p *natsProc) start() {
	p.t.Helper()
	cmd := exec.Command(p.bin, "-c", "nats.conf")
	cmd.Dir = p.dir
	cmd.Stdout, cmd.Stderr = testWriter{p.t}, testWriter{p.t}
	if err := cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	waitFor(p.t, 20*time.Second, "nats-server to listen on "+p.addr, func() bool {
		select {
		case <-done:
			p.t.Fatalf("nats-server exited: %v", cmd.ProcessState)
		default:
		}
		c, err := net.DialTimeout("tcp", p.addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// stop ends the server (SIGTERM, then SIGKILL after 10 s) and waits for
// it; stopping a stopped server does nothing.
func (p *natsProc) stop() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}
