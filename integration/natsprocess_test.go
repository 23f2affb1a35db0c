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

var (
	natsBuildOnce sync.Once
	natsBinPath   string
	natsBuildErr  error
)

// natsServerBinary builds nats-server, at the version this module pins,
// once per test binary.
func natsServerBinary(t testing.TB) string {
	t.Helper()
	natsBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "nats-server-bin")
		if err != nil {
			natsBuildErr = err
			return
		}
		natsBinPath = filepath.Join(dir, "nats-server")
		out, err := exec.Command("go", "build", "-o", natsBinPath, "github.com/nats-io/nats-server/v2").CombinedOutput()
		if err != nil {
			natsBuildErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsBuildErr != nil {
		t.Fatal(natsBuildErr)
	}
	return natsBinPath
}

// natsServerProcess runs a nats-server process configured as
// deploy/nats/README.md tells operators: the include nats-setup wrote
// into setup, taken as it is (its resolver directory relative to the
// server's working directory), with a listen address and JetStream. It
// returns the server's URL; the process is stopped with the test.
func natsServerProcess(t *testing.T, setup string) string {
	t.Helper()
	bin := natsServerBinary(t)
	dir := t.TempDir()
	name := gateway.NATSSetupFiles.ServerConfig
	include, err := os.ReadFile(filepath.Join(setup, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), include, 0o644); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	conf := fmt.Sprintf("include %s\nlisten: 127.0.0.1:%d\njetstream { store_dir: \"./js\" }\n", name, port)
	if err := os.WriteFile(filepath.Join(dir, "nats.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", "nats.conf")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = testWriter{t}, testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	waitFor(t, 20*time.Second, "nats-server to listen on "+addr, func() bool {
		select {
		case <-done:
			t.Fatalf("nats-server exited: %v", cmd.ProcessState)
		default:
		}
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return "nats://" + addr
}
