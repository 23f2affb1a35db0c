//go:build unix

package integration

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/agent"
)

// gateDialer dials NATS for an agent while it is open; closed, it cuts
// the agent's connections and refuses new ones, as a network that goes
// away for a moment would.
type gateDialer struct {
	mu     sync.Mutex
	closed bool
	conns  []net.Conn
}

func (g *gateDialer) Dial(network, addr string) (net.Conn, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, errors.New("the test's network is down")
	}
	c, err := net.DialTimeout(network, addr, 2*time.Second)
	if err == nil {
		g.conns = append(g.conns, c)
	}
	return c, err
}

func (g *gateDialer) set(closed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed = closed
	if closed {
		for _, c := range g.conns {
			c.Close()
		}
		g.conns = nil
	}
}

// TestCallWaitsForReconnectingAgent: a call sent while its host's agent
// is reconnecting (its connection cut a moment ago) waits for it and runs
// once it is back, exactly once. A call whose agent stays away longer
// than the wait fails as not connected, and never runs.
func TestCallWaitsForReconnectingAgent(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true}) // a server the test can watch
	gate := &gateDialer{}
	env.StartAgent("rejoin", func(c *agent.Config) {
		c.NATSOptions = append(c.NATSOptions, nats.SetCustomDialer(gate))
		c.ReconnectMin, c.ReconnectMax = 50*time.Millisecond, 100*time.Millisecond
	})
	env.WaitHost("rejoin", true)
	cs := env.Client("", nil)
	runs := filepath.Join(env.AgentDir("rejoin"), "runs")
	ranTimes := func() int {
		data, _ := os.ReadFile(runs)
		return strings.Count(string(data), "ran\n")
	}

	// The network goes; once the server has seen the agent's connection
	// go (a call sent before that is lost with it, and ends by silence),
	// it comes back after 800 ms.
	cut := func() {
		gate.set(true)
		waitFor(t, 10*time.Second, "the server to see the agent's connection go", func() bool {
			env.mu.Lock()
			ns := env.nats
			env.mu.Unlock()
			return connections(ns, "fleet-agent rejoin") == 0
		})
	}
	cut()
	start := time.Now()
	time.AfterFunc(800*time.Millisecond, func() { gate.set(false) })
	res := call(t, cs, "bash", map[string]any{"host": "rejoin", "command": "echo ran >> runs; echo back"})
	took := time.Since(start)
	if res.IsError || !strings.Contains(text(res), "back") {
		t.Fatalf("a call while the agent reconnects: %s", text(res))
	}
	if n := ranTimes(); n != 1 || took < 800*time.Millisecond {
		t.Errorf("the call ran %d times, answered %s after the cut (the network was down for 800ms)", n, took)
	}
	t.Logf("answered %s after the agent's connection was cut (back after 800ms)", took.Round(time.Millisecond))

	// Away for longer than a call waits: it fails as not connected, and
	// never runs.
	cut()
	start = time.Now()
	res = call(t, cs, "bash", map[string]any{"host": "rejoin", "command": "echo ran >> runs; echo late"})
	took = time.Since(start)
	gate.set(false)
	if !res.IsError || !strings.Contains(text(res), "not connected") || took > 6*time.Second {
		t.Errorf("a call whose agent stays away, after %s: %s", took, text(res))
	}
	waitFor(t, 20*time.Second, "the agent back", func() bool {
		res := call(t, cs, "bash", map[string]any{"host": "rejoin", "command": "echo here"})
		return !res.IsError
	})
	if n := ranTimes(); n != 1 {
		t.Errorf("after a call that failed as not connected the command ran %d times in all, want 1", n)
	}
}

// TestRestartedAgentNeverGetsACallAgain: an agent process killed while it
// runs a call, and started again at once, is never sent that call (nor
// one sent while it was down): the gateway asks only the process the call
// was sent to whether it has it, and the new one refuses to answer for
// another. Both calls fail, saying the agent restarted, as soon as the new
// process has announced itself; the command ran once, on the first.
func TestRestartedAgentNeverGetsACallAgain(t *testing.T) {
	env := NewEnv(t)
	env.StartAgentProcess("restarts")
	env.WaitHost("restarts", true)
	dir := env.AgentDir("restarts")
	killTasksAfter(t, dir)
	runs := filepath.Join(dir, "runs")
	// The agent's state directory lies in its working directory, where
	// confined commands may change what exists but make nothing new.
	writeFile(t, runs, "")
	cs := env.Client("", nil)
	type outcome struct {
		tag string
		res string
		err bool
	}
	out := make(chan outcome, 2)
	run := func(tag, command string) {
		res := call(t, cs, "bash", map[string]any{"host": "restarts", "command": command})
		out <- outcome{tag, text(res), res.IsError}
	}
	go run("running", "echo ran >> runs; sleep 2; echo first")
	waitFor(t, 20*time.Second, "the first call running", func() bool {
		data, _ := os.ReadFile(runs)
		return len(data) > 0
	})
	env.KillAgent("restarts")
	go run("sent while down", "echo ran >> runs; echo second")
	start := time.Now()
	env.RestartAgentProcess("restarts")
	t.Logf("the agent process was started again %s after the kill", time.Since(start).Round(time.Millisecond))
	for range 2 {
		o := <-out
		t.Logf("%s, %s after the restart began: %s", o.tag, time.Since(start).Round(time.Millisecond), o.res)
		if !o.err || !strings.Contains(o.res, "restarted during bash") {
			t.Errorf("the call %s: %s; want it failed, saying the agent restarted", o.tag, o.res)
		}
	}
	env.WaitHost("restarts", true)
	time.Sleep(time.Second) // a call sent again late would have run by now
	if data, _ := os.ReadFile(runs); strings.Count(string(data), "ran\n") != 1 {
		t.Errorf("the commands ran %d times in all, want once (the first, on the killed process)", strings.Count(string(data), "ran\n"))
	}
}
