//go:build unix

package integration

import (
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestAgentNameNotItsCredential: an agent started with a --name that is
// not the host its credential was issued for stops at start and says
// why, instead of looking joined while NATS refuses it every subject.
func TestAgentNameNotItsCredential(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	var stderr syncBuffer
	// web-1's identity, web-2's name.
	cmd := env.AgentCommand("web-1", t.TempDir(), "--name", "web-2")
	cmd.Stderr = &stderr
	started := time.Now()
	err := runWithin(t, cmd, 20*time.Second)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("the agent exited with %v; want exit code 2\n%s", err, stderr.String())
	}
	t.Logf("the agent stopped %s after it started", time.Since(started).Round(time.Millisecond))
	for _, want := range []string{"--name web-2", `is enrolled as "web-1"`, "its credential is for that name only", "drop --name"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the agent's error does not say %q:\n%s", want, stderr.String())
		}
	}
	if strings.Contains(stderr.String(), "joined fleet") {
		t.Errorf("the agent claimed to have joined:\n%s", stderr.String())
	}
	if _, ok := env.Gateway.Host("web-2"); ok {
		t.Error("the gateway lists web-2")
	}
}

// TestAgentStopsPromptlyWhenDisconnected: SIGTERM stops an agent that has
// lost NATS, or has never reached it, within a second or so: it does not
// wait for a goodbye that cannot be delivered, nor for a server that does
// not answer.
func TestAgentStopsPromptlyWhenDisconnected(t *testing.T) {
	const bound = 2 * time.Second
	t.Run("lost NATS", func(t *testing.T) {
		env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{}})
		var stderr syncBuffer
		cmd := env.AgentCommand("cut-off", t.TempDir(), "--log_level", "info")
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := waitProcess(cmd)
		defer func() { _ = cmd.Process.Kill(); <-done }()
		env.WaitHost("cut-off", true)
		env.StopNATS()
		waitFor(t, 20*time.Second, "the agent to notice NATS is gone", func() bool {
			return strings.Contains(stderr.String(), "NATS disconnected")
		})
		took := sigtermAndWait(t, cmd, done, bound)
		t.Logf("a disconnected agent stopped %s after SIGTERM", took.Round(time.Millisecond))
		if !strings.Contains(stderr.String(), "agent stopped") {
			t.Errorf("the agent did not stop cleanly:\n%s", stderr.String())
		}
	})
	t.Run("silent servers", func(t *testing.T) {
		// Three servers that take the connection and never say a word:
		// each costs the NATS client its 2 s handshake timeout.
		var urls []string
		accepted := make(chan struct{}, 16)
		for range 3 {
			urls = append(urls, "nats://"+silentServer(t, accepted))
		}
		env := NewEnv(t, Options{Agents: []string{}})
		cmd := env.AgentCommand("patient", t.TempDir(), "--nats", strings.Join(urls, ","))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := waitProcess(cmd)
		defer func() { _ = cmd.Process.Kill(); <-done }()
		select {
		case <-accepted:
		case <-time.After(20 * time.Second):
			t.Fatal("the agent never dialled the silent servers")
		}
		took := sigtermAndWait(t, cmd, done, bound)
		t.Logf("an agent mid-handshake stopped %s after SIGTERM", took.Round(time.Millisecond))
	})
}

// sigtermAndWait sends SIGTERM to cmd and returns how long it took to
// exit; longer than bound fails the test.
func sigtermAndWait(t *testing.T, cmd *exec.Cmd, done <-chan struct{}, bound time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not stop within 30s of SIGTERM")
	}
	took := time.Since(start)
	if took > bound {
		t.Errorf("the agent took %s to stop after SIGTERM; want at most %s", took.Round(time.Millisecond), bound)
	}
	if cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("the agent exited with %v after SIGTERM; want 0", cmd.ProcessState)
	}
	return took
}

// silentServer listens on loopback, accepts connections and never writes
// to them; accepted gets a value per connection. It stops with the test.
func silentServer(t *testing.T, accepted chan<- struct{}) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case accepted <- struct{}{}:
			default:
			}
			wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
