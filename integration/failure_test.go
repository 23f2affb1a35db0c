//go:build unix

package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/agent"
)

// TestSmallMaxPayload proves nothing assumes a message fits in NATS's
// max_payload: with a 64 KiB limit, 5 MB writes, reads and bash outputs
// still work.
func TestSmallMaxPayload(t *testing.T) {
	env := NewEnv(t, Options{MaxPayload: 64 << 10})
	cs := env.Client("2025-11-25", nil)

	var content bytes.Buffer
	for i := 0; content.Len() < 5<<20; i++ {
		fmt.Fprintf(&content, "line %07d %s\n", i, strings.Repeat("x", 80))
	}
	mustOK(t, call(t, cs, "write", map[string]any{"host": "alpha", "path": "big.txt", "content": content.String()}))
	data, err := os.ReadFile(filepath.Join(env.AgentDir("alpha"), "big.txt"))
	if err != nil || sha256.Sum256(data) != sha256.Sum256(content.Bytes()) {
		t.Fatalf("5 MB write arrived damaged (%d bytes, %v)", len(data), err)
	}

	got := mustOK(t, call(t, cs, "read", map[string]any{"host": "alpha", "path": "big.txt", "offset": 30000}))
	if !strings.HasPrefix(got, "line 0029999 ") || !strings.Contains(got, "Use offset=") {
		t.Fatalf("read of big file: %q...", got[:min(len(got), 200)])
	}
	if len(got) < 45<<10 {
		t.Fatalf("read returned only %d bytes; expected close to the 50KB limit", len(got))
	}

	got = mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "cat big.txt"}))
	if !strings.Contains(got, "Full output:") || len(got) < 45<<10 {
		t.Fatalf("bash of 5 MB output: %d bytes, tail %q", len(got), got[max(0, len(got)-200):])
	}
	// Edits of the big file cross the limit in both directions too.
	mustOK(t, call(t, cs, "edit", map[string]any{"host": "alpha", "path": "big.txt", "edits": []map[string]any{
		{"old_string": "line 0000000 ", "new_string": "LINE ZERO "},
	}}))
}

// TestAgentKilledMidCall: a host that dies mid-call yields a tool error
// naming it within a few seconds, never a hang.
func TestAgentKilledMidCall(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	env.StartAgentProcess("victim")
	env.WaitHost("victim", true)
	cs := env.Client("2025-11-25", nil)
	// The agent's state directory lies in its working directory, where
	// confined commands may change what exists but make nothing new.
	writeFile(t, filepath.Join(env.AgentDir("victim"), "started"), "")

	type outcome struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "victim", "command": "echo running > started; sleep 60"}})
		done <- outcome{res, err}
	}()
	waitForFile(t, filepath.Join(env.AgentDir("victim"), "started"))
	killed := time.Now()
	env.KillAgent("victim")
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("call failed as a protocol error: %v", o.err)
		}
		msg := mustErr(t, o.res, "victim")
		took := time.Since(killed)
		t.Logf("error after %s: %s", took.Round(time.Millisecond), msg)
		if took > 8*time.Second {
			t.Fatalf("took %s to notice the dead host", took)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("call hung after its agent was killed")
	}
}

// TestNATSRestart: agents and the gateway reconnect on their own and calls
// work again.
func TestNATSRestart(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true})
	env.StartAgentProcess("proc")
	env.WaitHost("proc", true)
	cs := env.Client("2025-11-25", nil)
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo before"}))

	env.StopNATS()
	ready := "http://" + env.Gateway.Addr() + "/readyz"
	waitFor(t, 10*time.Second, "the gateway to notice NATS is gone", func() bool {
		resp, err := http.Get(ready)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	env.RestartNATS()

	for _, host := range []string{"alpha", "proc"} {
		waitFor(t, 20*time.Second, host+" answering after NATS restart", func() bool {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": host, "command": "echo after"}})
			return err == nil && !res.IsError && text(res) == "after\n"
		})
	}
}

// TestCallSurvivesNATSRestart: a running command's result still arrives
// when NATS is down for longer than the silence period while it runs (the
// gateway stops its silence clock while disconnected and fetches the
// result again).
func TestCallSurvivesNATSRestart(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true})
	cs := env.Client("2025-11-25", nil)
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "alpha", "command": "echo running > survive-started; sleep 1; echo survived; echo done > survive-done"}})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	dir := env.AgentDir("alpha")
	waitForFile(t, filepath.Join(dir, "survive-started"))
	env.StopNATS()
	stopped := time.Now()
	// The command finishes while NATS is down, and the outage lasts
	// 2.5 times the silence period (5 s): a gateway that kept its
	// silence clock running would have failed the call by then.
	waitForFile(t, filepath.Join(dir, "survive-done"))
	time.Sleep(time.Until(stopped.Add(5 * time.Second)))
	env.RestartNATS()
	select {
	case res := <-done:
		if got := mustOK(t, res); got != "survived\n" {
			t.Fatalf("got %q", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("call never finished")
	}
}

func TestBusyAgent(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	env.StartAgent("small", func(c *agent.Config) { c.MaxConcurrent = 1; c.MaxQueue = 1 })
	env.WaitHost("small", true)
	cs := env.Client("2025-11-25", nil)
	var wg sync.WaitGroup
	results := make([]*mcp.CallToolResult, 4)
	for i := range results {
		wg.Go(func() {
			results[i] = call(t, cs, "bash", map[string]any{"host": "small", "command": "sleep 1; echo ok"})
		})
	}
	wg.Wait()
	ok, busy := 0, 0
	for _, r := range results {
		switch {
		case !r.IsError:
			ok++
		case strings.Contains(text(r), "busy"):
			busy++
		default:
			t.Fatalf("unexpected error: %s", text(r))
		}
	}
	if ok != 2 || busy != 2 {
		t.Fatalf("with 1 worker and a queue of 1, 4 calls gave %d ok and %d busy; want 2 and 2", ok, busy)
	}
}

// TestAgentDrainsOnSIGTERM: in-flight calls finish, then the agent leaves.
func TestAgentDrainsOnSIGTERM(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	env.StartAgentProcess("drainer")
	env.WaitHost("drainer", true)
	cs := env.Client("2025-11-25", nil)
	// The agent's state directory lies in its working directory, where
	// confined commands may change what exists but make nothing new.
	writeFile(t, filepath.Join(env.AgentDir("drainer"), "started"), "")
	done := callAsync(cs, "bash", map[string]any{"host": "drainer", "command": "echo running > started; sleep 1; echo finished"})
	waitForFile(t, filepath.Join(env.AgentDir("drainer"), "started"))
	if err := syscall.Kill(env.AgentPID("drainer"), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if got := mustOK(t, awaitCall(t, done, 60*time.Second)); got != "finished\n" {
		t.Fatalf("got %q", got)
	}
	env.WaitHost("drainer", false)
}

// TestDuplicateHostName: two machines announcing one name must not both run
// every call; the gateway refuses calls to that name and says why. Two
// agents can only share a name by sharing its enrolled identity, so the
// conflict stands until an operator acts.
func TestDuplicateHostName(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"twin"}})
	second, err := agent.New(env.AgentConfig("twin"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); _ = second.Run(ctx) }()

	cs := env.Client("2025-11-25", nil)
	waitFor(t, 10*time.Second, "the conflict to be seen", func() bool {
		h, _ := env.Gateway.Host("twin")
		return h.Conflict != ""
	})
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "twin", "command": "echo once"}), "claimed by more than one machine")
	if hosts := mustOK(t, call(t, cs, "hosts", nil)); !strings.Contains(hosts, "conflict") {
		t.Fatalf("hosts does not show the conflict:\n%s", hosts)
	}

	// Both agents use one enrolled identity (one key): the NATS servers
	// show two live connections on it, which stays a conflict after the
	// second leaves, until an operator revokes the host (or re-enrols it
	// with --replace).
	waitFor(t, 10*time.Second, "the identity conflict to be seen", func() bool {
		h, _ := env.Gateway.Host("twin")
		return h.IdentityConflict
	})
	cancel()
	<-stopped
	// Nothing shows that the gateway has heard of the second agent's
	// disconnect (a server event) and kept the conflict: give it a second
	// to clear it wrongly.
	time.Sleep(time.Second)
	if h, _ := env.Gateway.Host("twin"); !h.IdentityConflict || !h.Online {
		t.Fatalf("after the second agent left: conflict %q (identity %v), online %v; want the conflict to stand", h.Conflict, h.IdentityConflict, h.Online)
	}
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "twin", "command": "echo once"}), "claimed by more than one machine")
	if err := env.Gateway.RevokeAgent(t.Context(), "twin", "test"); err != nil {
		t.Fatal(err)
	}
	if h, _ := env.Gateway.Host("twin"); h.Conflict != "" || !h.Revoked {
		t.Fatalf("after the revocation: conflict %q, revoked %v", h.Conflict, h.Revoked)
	}
}
