//go:build unix

package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// TestAgentRestartTakesOver: an agent killed with SIGKILL and restarted
// at once on its state directory serves calls at once: the gateway knows
// the new process for the same installation and does not wait for the
// dead one's heartbeats to expire (here a minute) before routing to it.
func TestAgentRestartTakesOver(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.OfflineAfter = time.Minute }})
	env.StartAgentProcess("phoenix")
	env.WaitHost("phoenix", true)
	cs := env.Client("2025-11-25", nil)
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "phoenix", "command": "echo first"}))
	first, _ := env.Gateway.Host("phoenix")
	if len(first.AgentID) != 32 {
		t.Fatalf("the agent announces agent ID %q; want 32 hex digits from its state directory", first.AgentID)
	}

	for round := range 3 {
		before, _ := env.Gateway.Host("phoenix")
		env.KillAgent("phoenix")
		restarted := time.Now()
		env.RestartAgentProcess("phoenix")
		waitFor(t, 20*time.Second, "the restarted agent's first announce", func() bool {
			h, _ := env.Gateway.Host("phoenix")
			return h.Instance != before.Instance
		})
		h, _ := env.Gateway.Host("phoenix")
		if h.Conflict != "" || !h.Online {
			t.Fatalf("round %d: after a restart the host shows conflict %q, online %v; want the new process to take over", round, h.Conflict, h.Online)
		}
		if h.AgentID != first.AgentID {
			t.Fatalf("round %d: agent ID changed across a restart: %q, was %q", round, h.AgentID, first.AgentID)
		}
		if got := mustOK(t, call(t, cs, "bash", map[string]any{"host": "phoenix", "command": "echo again"})); got != "again\n" {
			t.Fatalf("round %d: got %q", round, got)
		}
		t.Logf("round %d: the restarted agent served a call %s after the kill", round, time.Since(restarted).Round(time.Millisecond))
	}
}

// TestCopiedStateDirIsAConflict: a state directory copied to another
// machine (a cloned VM) gives two live processes of one installation;
// the take-over a restart gets must not hide that.
func TestCopiedStateDirIsAConflict(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.OfflineAfter = time.Minute }})
	env.StartAgentProcess("golden")
	env.WaitHost("golden", true)
	orig, _ := env.Gateway.Host("golden")

	clone := t.TempDir()
	id, err := os.ReadFile(filepath.Join(env.AgentDir("golden"), ".state", "agent-id"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(clone, ".state"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(clone, ".state", "agent-id"), id, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := env.AgentCommand("golden", clone)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	waitFor(t, 20*time.Second, "the conflict to be seen", func() bool {
		h, _ := env.Gateway.Host("golden")
		return h.Conflict != ""
	})
	h, _ := env.Gateway.Host("golden")
	if h.AgentID != orig.AgentID {
		t.Fatalf("the clone announces agent ID %q, want the copied %q", h.AgentID, orig.AgentID)
	}
	cs := env.Client("2025-11-25", nil)
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "golden", "command": "echo once"}), "claimed by more than one machine")
}

// TestStateDirHeldByOneAgent: a second agent started on the state
// directory of a running one (the same join command run twice, or two
// agents on the default directory) is refused at start with the reason,
// and the first one's background tasks are left alone. The tasks, which
// outlive their agent, do not hold the directory: an agent killed while
// one runs is replaced at once.
func TestStateDirHeldByOneAgent(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	env.StartAgentProcess("holder")
	env.WaitHost("holder", true)
	cs := env.Client("2025-11-25", nil)
	dir := env.AgentDir("holder")
	killTasksAfter(t, dir)
	task, _ := startBackground(t, cs, "holder", "exec sleep 300", nil)
	pid := env.AgentPID("holder")
	state := filepath.Join(dir, ".state")

	for _, name := range []string{"holder", "another"} {
		var stderr bytes.Buffer
		cmd := env.AgentCommand(name, dir)
		cmd.Stderr = &stderr
		err := runWithin(t, cmd, 20*time.Second)
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Fatalf("a second agent (%s) on the state directory exited with %v; want exit code 2\n%s", name, err, stderr.String())
		}
		want := "state directory " + state + " is in use by another fleet-agent (pid " + strconv.Itoa(pid) + ")"
		if !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "--state_dir") {
			t.Fatalf("a second agent (%s) said:\n%s\nwant it to say %q and name --state_dir", name, stderr.String(), want)
		}
		if strings.Contains(stderr.String(), "background task") {
			t.Fatalf("the refused agent touched the background tasks:\n%s", stderr.String())
		}
	}
	if _, ok := env.Gateway.Host("another"); ok {
		t.Fatal("the refused agent joined the fleet")
	}
	if st, res := taskStatus(t, cs, "holder", task, 0); st["state"] != "running" {
		t.Fatalf("the first agent's task after the refusals: %s", text(res))
	}
	if list := mustOK(t, call(t, cs, "task_list", map[string]any{"host": "holder"})); !strings.Contains(list, task) {
		t.Fatalf("task_list no longer shows the task:\n%s", list)
	}

	before, _ := env.Gateway.Host("holder")
	env.KillAgent("holder")
	env.RestartAgentProcess("holder")
	waitFor(t, 20*time.Second, "the replacement agent to announce", func() bool {
		h, _ := env.Gateway.Host("holder")
		return h.Instance != before.Instance
	})
	st, res := taskStatus(t, cs, "holder", task, 0)
	if st["state"] != "running" {
		t.Fatalf("the task after the agent was replaced: %s", text(res))
	}
	// The replacement re-attached it: it can cancel it.
	mustOK(t, call(t, cs, "task_cancel", map[string]any{"host": "holder", "task_id": task}))
	if st, res := awaitTask(t, cs, "holder", task); st["state"] != "cancelled" || st["reattached"] != true {
		t.Fatalf("the re-attached task after task_cancel: %s", text(res))
	}
}

// runWithin runs cmd and returns its exit error; a command still running
// after d is killed and fails the test.
func runWithin(t *testing.T, cmd *exec.Cmd, d time.Duration) error {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-done
		t.Fatalf("%s still running after %s", strings.Join(cmd.Args, " "), d)
		return nil
	}
}
