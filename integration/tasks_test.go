//go:build unix

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Background tasks end to end: the go-sdk client over HTTP, the gateway,
// NATS and agents, real processes. Timings are generous: the machine may
// be loaded.

// gone reports whether process pid is gone (or a zombie) within 10 s.
func gone(pid int) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return true
		}
		if i := strings.LastIndexByte(string(data), ')'); i > 0 && strings.HasPrefix(string(data[i:]), ") Z") {
			return true
		}
	}
	return false
}

// Start a task, wait for it server-side (with progress notifications
// while it runs), read its output file.
func TestTaskBackgroundWaitAndRead(t *testing.T) {
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) { c.ProgressIdle = 700 * time.Millisecond }})
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			var pl progressLog
			cs := env.Client(era.Version, &mcp.ClientOptions{ProgressNotificationHandler: pl.Handler})
			killTasksAfter(t, env.AgentDir("alpha"))
			started := time.Now()
			id, output := startBackground(t, cs, "alpha", "echo start; sleep 3; for i in 1 2 3; do echo line $i; done; echo err >&2; exit 5", nil)
			if took := time.Since(started); took > 2500*time.Millisecond {
				t.Fatalf("the background start took %s: it must not wait for the command", took)
			}
			params := &mcp.CallToolParams{Name: "task_status", Arguments: map[string]any{"host": "alpha", "task_id": id, "wait": 60}}
			params.SetProgressToken("task-" + era.Name)
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			res, err := cs.CallTool(ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			st := structured(t, res)
			if st["state"] != "failed" || st["exit_code"] != 5.0 {
				t.Fatalf("after the wait: %s", text(res))
			}
			if tail, _ := st["output_tail"].(string); tail != "start\nline 1\nline 2\nline 3\nerr\n" {
				t.Fatalf("output tail %q", tail)
			}
			if pl.Count() == 0 {
				t.Errorf("no progress notification during a wait of about 3 s")
			}
			got := mustOK(t, call(t, cs, "read", map[string]any{"host": "alpha", "path": output}))
			if !strings.HasPrefix(got, "start\nline 1\n") {
				t.Fatalf("read of the output file: %q", got)
			}
			list := call(t, cs, "task_list", map[string]any{"host": "alpha", "state": "failed"})
			if !strings.Contains(mustOK(t, list), id) {
				t.Fatalf("task_list: %s", text(list))
			}
		})
	}
}

// Cancel kills the task's whole process group; a timeout does too.
func TestTaskCancelAndTimeout(t *testing.T) {
	env := NewEnv(t)
	cs := env.Client("", nil)
	dir := env.AgentDir("alpha")
	killTasksAfter(t, dir)
	id, _ := startBackground(t, cs, "alpha", "sleep 300 & echo $! > child.pid; wait", nil)
	child, _ := strconv.Atoi(waitForFile(t, filepath.Join(dir, "child.pid")))
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	res := call(t, cs, "task_cancel", map[string]any{"host": "alpha", "task_id": id})
	mustOK(t, res)
	if st := structured(t, res); st["state"] != "cancelled" {
		t.Fatalf("cancel: %s", text(res))
	}
	if !gone(child) {
		t.Fatalf("the task's child %d survived task_cancel", child)
	}

	os.Remove(filepath.Join(dir, "child.pid"))
	id, _ = startBackground(t, cs, "alpha", "sleep 300 & echo $! > child.pid; wait", map[string]any{"timeout": 1})
	child, _ = strconv.Atoi(waitForFile(t, filepath.Join(dir, "child.pid")))
	t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
	st, res := awaitTask(t, cs, "alpha", id)
	if st["state"] != "timed_out" || !strings.Contains(text(res), "timed out after 1 s") {
		t.Fatalf("timeout: %s", text(res))
	}
	if !gone(child) {
		t.Fatalf("the task's child %d survived the timeout", child)
	}
}

// An agent killed while a task runs: the next agent on the same state
// directory re-attaches to the task and records its exit code; a task
// whose command was killed while no agent ran has the exit status its
// wrapper recorded; a task whose whole process group was killed then is
// lost. Nothing stays running forever.
func TestTaskSurvivesAgentRestart(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	env.StartAgentProcess("worker")
	env.WaitHost("worker", true)
	cs := env.Client("2025-11-25", nil)
	dir := env.AgentDir("worker")
	killTasksAfter(t, dir)
	// The agent's state directory lies in its working directory, where
	// confined commands may change what exists but make nothing new.
	writeFile(t, filepath.Join(dir, "killed.pid"), "")
	writeFile(t, filepath.Join(dir, "lost.pid"), "")

	keeps, _ := startBackground(t, cs, "worker", "while [ ! -e gate ]; do sleep 0.05; done; echo finished; exit 4", nil)
	killed, _ := startBackground(t, cs, "worker", "echo $$ > killed.pid; exec sleep 300", nil)
	lost, _ := startBackground(t, cs, "worker", "echo $$ > lost.pid; exec sleep 300", nil)
	killedPID, _ := strconv.Atoi(waitForFile(t, filepath.Join(dir, "killed.pid")))
	lostPID, _ := strconv.Atoi(waitForFile(t, filepath.Join(dir, "lost.pid")))
	lostGroup, err := syscall.Getpgid(lostPID)
	if err != nil || lostGroup == lostPID {
		t.Fatalf("the task's command should run in its wrapper's process group: %d, %v", lostGroup, err)
	}

	env.KillAgent("worker")
	// While no agent runs: one command is killed, the other task's whole
	// group (its wrapper too).
	syscall.Kill(killedPID, syscall.SIGKILL)
	syscall.Kill(-lostGroup, syscall.SIGKILL)
	if !gone(killedPID) || !gone(lostGroup) {
		t.Fatal("the tasks did not die")
	}
	env.WaitHost("worker", false) // so that WaitHost below waits for the new process
	env.RestartAgentProcess("worker")
	env.WaitHost("worker", true)

	st, res := taskStatus(t, cs, "worker", keeps, 0)
	if st["state"] != "running" {
		t.Fatalf("the surviving task after the restart: %s", text(res))
	}
	st, res = taskStatus(t, cs, "worker", killed, 0)
	if st["state"] != "failed" || st["exit_code"] != 137.0 || !strings.Contains(text(res), "no agent was running") {
		t.Fatalf("the task whose command was killed meanwhile: %s", text(res))
	}
	st, res = taskStatus(t, cs, "worker", lost, 0)
	if st["state"] != "lost" {
		t.Fatalf("the task whose group was killed meanwhile: %s", text(res))
	}
	if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	st, res = awaitTask(t, cs, "worker", keeps)
	if st["state"] != "failed" || st["exit_code"] != 4.0 || st["reattached"] != true || st["output_tail"] != "finished\n" {
		t.Fatalf("the re-attached task: %s", text(res))
	}
}

// A gateway restart during a server-side wait loses nothing: the task's
// state is on the agent.
func TestTaskSurvivesGatewayRestart(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true})
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			dir := env.AgentDir("alpha")
			killTasksAfter(t, dir)
			gate := filepath.Join(dir, "gate-"+era.Name)
			cs := env.Client(era.Version, nil)
			id, _ := startBackground(t, cs, "alpha", "while [ ! -e "+filepath.Base(gate)+" ]; do sleep 0.05; done; echo through", nil)

			calls, stop := capture(t, env.GatewayConn(), protocol.CallSubject("alpha"))
			defer stop()
			waiting := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "task_status", Arguments: map[string]any{"host": "alpha", "task_id": id, "wait": 60}})
				waiting <- err
			}()
			next(t, calls, "the task_status call on its way to the agent")
			env.RestartGateway()
			select {
			case <-waiting: // cut off: an error or a tool error, either is fine
			case <-time.After(60 * time.Second):
				t.Fatal("a wait through a gateway restart hung")
			}
			env.WaitHost("alpha", true)

			cs = env.Client(era.Version, nil)
			st, res := taskStatus(t, cs, "alpha", id, 0)
			if st["state"] != "running" {
				t.Fatalf("after the gateway restart: %s", text(res))
			}
			if err := os.WriteFile(gate, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			st, res = awaitTask(t, cs, "alpha", id)
			if st["state"] != "succeeded" || st["output_tail"] != "through\n" {
				t.Fatalf("after the gate opened: %s", text(res))
			}
		})
	}
}

// Retention removes finished tasks only: never running ones, never a
// folder whose status cannot be read.
func TestTaskRetention(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	var stateDir string
	env.StartAgent("keeper", func(c *agent.Config) {
		c.TaskRetention = time.Millisecond // every finished task is old
		stateDir = c.StateDir
	})
	env.WaitHost("keeper", true)
	cs := env.Client("", nil)
	killTasksAfter(t, env.AgentDir("keeper"))

	done, _ := startBackground(t, cs, "keeper", "echo done", nil)
	awaitTask(t, cs, "keeper", done)
	broken := filepath.Join(stateDir, "tasks", "t20000101-000000-000000-00000000")
	if err := os.MkdirAll(broken, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(broken, "status.json"), []byte(`{"state":"succ`), 0o600); err != nil {
		t.Fatal(err)
	}
	running, _ := startBackground(t, cs, "keeper", "sleep 300", nil)
	t.Cleanup(func() { call(t, cs, "task_cancel", map[string]any{"host": "keeper", "task_id": running}) })
	startBackground(t, cs, "keeper", "echo later", nil)

	mustErr(t, call(t, cs, "task_status", map[string]any{"host": "keeper", "task_id": done, "wait": 0}), "retention removed it")
	if st, res := taskStatus(t, cs, "keeper", running, 0); st["state"] != "running" {
		t.Fatalf("a running task was touched by retention: %s", text(res))
	}
	if _, err := os.Stat(filepath.Join(broken, "status.json")); err != nil {
		t.Fatalf("an unreadable task folder was removed: %v", err)
	}
	list := mustOK(t, call(t, cs, "task_list", map[string]any{"host": "keeper"}))
	if !strings.Contains(list, "1 task folders have an unreadable status") {
		t.Fatalf("task_list does not report the unreadable folder:\n%s", list)
	}
}

// The limits on running and queued tasks: beyond them a busy error names
// them; a slot freed is used.
func TestTaskBusyLimits(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	env.StartAgent("small", func(c *agent.Config) { c.MaxRunningTasks, c.MaxQueuedTasks = 1, 1 })
	env.WaitHost("small", true)
	cs := env.Client("2025-11-25", nil)
	killTasksAfter(t, env.AgentDir("small"))

	first, _ := startBackground(t, cs, "small", "sleep 300", nil)
	second, _ := startBackground(t, cs, "small", "echo second", nil)
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "small", "command": "echo third", "background": true}), "--max_tasks 1, --max_task_queue 1")
	if st, res := taskStatus(t, cs, "small", second, 0); st["state"] != "queued" {
		t.Fatalf("second: %s", text(res))
	}
	mustOK(t, call(t, cs, "task_cancel", map[string]any{"host": "small", "task_id": first}))
	if st, res := awaitTask(t, cs, "small", second); st["state"] != "succeeded" {
		t.Fatalf("second after the first was cancelled: %s", text(res))
	}
	third, _ := startBackground(t, cs, "small", "echo third", nil)
	if st, res := awaitTask(t, cs, "small", third); st["state"] != "succeeded" {
		t.Fatalf("third once there was room: %s", text(res))
	}
}

// The task tools are listed and come with bash.
func TestTaskToolsListed(t *testing.T) {
	env := NewEnv(t)
	cs := env.Client("", nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for _, tool := range res.Tools {
		found[tool.Name] = tool.Description
	}
	for _, name := range []string{"task_status", "task_cancel", "task_list"} {
		if found[name] == "" {
			t.Errorf("tools/list lacks %s", name)
		}
	}
	for _, limit := range []string{
		fmt.Sprintf("at most %v", protocol.TaskMaxWait.Seconds()),
		fmt.Sprintf("%d lines", protocol.TaskTailLines),
		protocol.SizeText(protocol.TaskTailBytes),
	} {
		if !strings.Contains(found["task_status"], limit) {
			t.Errorf("task_status description does not state %q", limit)
		}
	}
	if !strings.Contains(found["bash"], "background: true") || !strings.Contains(found["bash"], protocol.SizeText(protocol.TaskMaxOutputBytes)) {
		t.Errorf("bash description does not explain background tasks")
	}
	h, _ := env.Gateway.Host("alpha")
	if !strings.Contains(strings.Join(h.Tools, ","), "task_status") {
		t.Errorf("alpha does not announce the task tools: %v", h.Tools)
	}
}
