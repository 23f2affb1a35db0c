//go:build unix

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/tasks"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// taskBox returns a toolbox with its task manager open, on stateDir (""
// for a fresh one). Every task still running when the test ends is
// killed with its process group.
func taskBox(t *testing.T, stateDir string, mod func(*tasks.Config)) *toolbox {
	t.Helper()
	if stateDir == "" {
		stateDir = filepath.Join(t.TempDir(), "state")
	}
	cfg := toolboxConfig{
		Cwd:                t.TempDir(),
		StateDir:           stateDir,
		Shell:              "/bin/sh",
		BashDefaultTimeout: 120 * time.Second,
		BashMaxTimeout:     600 * time.Second,
		ChildEnv:           os.Environ(),
		Host:               "test-host",
		Tasks:              tasks.Config{Poll: 50 * time.Millisecond},
	}
	if mod != nil {
		mod(&cfg.Tasks)
	}
	tb, err := newToolbox(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.tasks.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tb.tasks.Close()
		killTaskGroups(tb.tasks)
	})
	return tb
}

// killTaskGroups kills the process group of every task m records as
// running.
func killTaskGroups(m *tasks.Manager) {
	ids, _ := m.List()
	for _, id := range ids {
		if st, err := m.Status(id); err == nil && st.State == tasks.Running && st.Alive() {
			_ = syscall.Kill(-st.PID, syscall.SIGKILL)
		}
	}
}

// taskCall runs a task tool and decodes its structured task view.
func taskCall(t *testing.T, tb *toolbox, tool string, args map[string]any) (*protocol.Result, taskView) {
	t.Helper()
	r, _ := tbCall(t, context.Background(), tb, tool, args)
	var v taskView
	if r.Error == nil && len(r.Structured) > 0 {
		if err := json.Unmarshal(r.Structured, &v); err != nil {
			t.Fatalf("%s structured content: %v", tool, err)
		}
	}
	return r, v
}

// startTask starts command as a background task and returns its ID.
func startTask(t *testing.T, tb *toolbox, command string, extra map[string]any) string {
	t.Helper()
	args := map[string]any{"command": command, "background": true}
	for k, v := range extra {
		args[k] = v
	}
	r, v := taskCall(t, tb, "bash", args)
	if r.Error != nil || r.IsError {
		t.Fatalf("start %q: %+v %s", command, r.Error, resultTextOf(r))
	}
	if tasks.ValidID(v.TaskID) != nil {
		t.Fatalf("start %q: task ID %q", command, v.TaskID)
	}
	return v.TaskID
}

func resultTextOf(r *protocol.Result) string {
	var b strings.Builder
	for _, c := range r.Content {
		b.WriteString(c.Text)
	}
	if r.Error != nil {
		b.WriteString(r.Error.Message)
	}
	return b.String()
}

// waitTask calls task_status with wait until the task has ended, for at
// most a minute.
func waitTask(t *testing.T, tb *toolbox, id string) (*protocol.Result, taskView) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		r, v := taskCall(t, tb, "task_status", map[string]any{"task_id": id, "wait": 10})
		if r.Error != nil || r.IsError {
			t.Fatalf("task_status %s: %s", id, resultTextOf(r))
		}
		if v.State.Ended() {
			return r, v
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s still %s after a minute", id, v.State)
		}
	}
}

// waitFile waits up to 20 s for path to exist with content and returns it.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if data, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(data), "\n") {
			return string(data)
		}
	}
	t.Fatalf("%s never appeared", path)
	return ""
}

func TestTaskRunsAndReports(t *testing.T) {
	tb := taskBox(t, "", nil)
	id := startTask(t, tb, "echo hello; echo oops >&2; pwd", nil)
	r, v := waitTask(t, tb, id)
	if v.State != tasks.Succeeded || v.ExitCode == nil || *v.ExitCode != 0 {
		t.Fatalf("state %s, exit %v: %s", v.State, v.ExitCode, resultTextOf(r))
	}
	want := "hello\noops\n" + tb.cfg.Cwd + "\n"
	if v.OutputTail == nil || *v.OutputTail != want {
		t.Fatalf("tail = %v, want %q", v.OutputTail, want)
	}
	text := resultTextOf(r)
	for _, s := range []string{"Task " + id + " on test-host: succeeded (exit code 0)", "Command: echo hello", v.OutputFile, "--- output ---\n" + want} {
		if !strings.Contains(text, s) {
			t.Errorf("status text lacks %q:\n%s", s, text)
		}
	}
	if v.TimeoutSeconds != 3600 || v.OutputBytes != int64(len(want)) {
		t.Errorf("timeout %v s, output %d bytes", v.TimeoutSeconds, v.OutputBytes)
	}
	// The output file is readable with read, though it is in the state
	// directory.
	got, isErr, _ := taskRead(t, tb, map[string]any{"path": v.OutputFile})
	if isErr || !strings.Contains(got, "hello") {
		t.Fatalf("read of the output file: %s", got)
	}
	// Its siblings are the agent's own.
	got, isErr, _ = taskRead(t, tb, map[string]any{"path": filepath.Join(filepath.Dir(v.OutputFile), "status.json")})
	if !isErr || !strings.Contains(got, "belongs to the agent") {
		t.Fatalf("read of status.json: %v %s", isErr, got)
	}

	// A command that ends at once is still a started task.
	for range 20 {
		startTask(t, tb, "true", nil)
	}
	id = startTask(t, tb, "echo failing; exit 3", nil)
	_, v = waitTask(t, tb, id)
	if v.State != tasks.Failed || v.ExitCode == nil || *v.ExitCode != 3 {
		t.Fatalf("exit 3: state %s, exit %v", v.State, v.ExitCode)
	}
}

// taskRead runs the read tool.
func taskRead(t *testing.T, tb *toolbox, args map[string]any) (string, bool, *protocol.Error) {
	t.Helper()
	r, _ := tbCall(t, context.Background(), tb, "read", args)
	return resultTextOf(r), r.IsError || r.Error != nil, r.Error
}

// A task_status wait returns as soon as the task ends, and a wait of 0
// answers at once.
func TestTaskStatusWait(t *testing.T) {
	tb := taskBox(t, "", nil)
	gate := filepath.Join(tb.cfg.Cwd, "gate")
	id := startTask(t, tb, "while [ ! -e gate ]; do sleep 0.02; done; echo through", nil)

	r, v := taskCall(t, tb, "task_status", map[string]any{"task_id": id, "wait": 0})
	if v.State != tasks.Running || v.OutputTail != nil || !strings.Contains(resultTextOf(r), "Running since") {
		t.Fatalf("wait 0: %s", resultTextOf(r))
	}
	start := time.Now()
	r, v = taskCall(t, tb, "task_status", map[string]any{"task_id": id, "wait": 0.3})
	if v.State != tasks.Running || time.Since(start) < 250*time.Millisecond || !strings.Contains(resultTextOf(r), "call task_status again") {
		t.Fatalf("wait 0.3 on a running task returned after %s: %s", time.Since(start), resultTextOf(r))
	}
	time.AfterFunc(300*time.Millisecond, func() { os.WriteFile(gate, nil, 0o600) })
	start = time.Now()
	_, v = taskCall(t, tb, "task_status", map[string]any{"task_id": id, "wait": 60})
	if v.State != tasks.Succeeded {
		t.Fatalf("state %s after a 60 s wait", v.State)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("the wait did not end with the task: %s", took)
	}

	// A cancelled call stops waiting.
	id = startTask(t, tb, "sleep 30", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	r, _ = tbCall(t, ctx, tb, "task_status", map[string]any{"task_id": id, "wait": 60})
	if !strings.Contains(resultTextOf(r), "running") {
		t.Fatalf("cancelled wait: %s", resultTextOf(r))
	}
}

// Beyond MaxWaits waiting calls, task_status answers at once and says why.
func TestTaskStatusWaitLimit(t *testing.T) {
	tb := taskBox(t, "", func(c *tasks.Config) { c.MaxWaits = 1 })
	id := startTask(t, tb, "sleep 30", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tb.taskStatus(ctx, &toolCall{ID: "w1", Args: json.RawMessage(`{"task_id":"` + id + `","wait":60}`), Output: func([]byte) {}})
	}()
	waitTaskWaits(t, tb, 1)
	r, v := taskCall(t, tb, "task_status", map[string]any{"task_id": id, "wait": 60})
	if v.WaitLimitReason == "" || !strings.Contains(resultTextOf(r), "Not waited: 1 task_status calls are waiting") {
		t.Fatalf("second wait: %s", resultTextOf(r))
	}
	cancel()
	<-done
}

// waitTaskWaits waits until n task_status calls are waiting on tb's tasks.
func waitTaskWaits(t *testing.T, tb *toolbox, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := tb.tasks.Waiting()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d task_status calls waiting after 10 s, want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// processGroupGone waits for every process of group pgid to be gone.
func processGroupGone(pgid int) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
	}
	return false
}

// A task's grandchildren die with it on timeout and on cancel.
func TestTaskTimeoutAndCancelKillGroup(t *testing.T) {
	tb := taskBox(t, "", nil)
	// The grandchild sleep writes its PID, then the command waits for it.
	const cmd = "sleep 300 & echo $! > child.pid; wait"

	id := startTask(t, tb, cmd, map[string]any{"timeout": 0.5})
	pidFile := filepath.Join(tb.cfg.Cwd, "child.pid")
	child, _ := strconv.Atoi(strings.TrimSpace(waitFile(t, pidFile)))
	killLater(t, child)
	r, v := waitTask(t, tb, id)
	if v.State != tasks.TimedOut || !strings.Contains(resultTextOf(r), "timed out after 0.5 s") {
		t.Fatalf("timeout: %s", resultTextOf(r))
	}
	if !processGone(child) {
		t.Fatalf("grandchild sleep %d survived the timeout", child)
	}
	os.Remove(pidFile)

	id = startTask(t, tb, cmd, nil)
	child, _ = strconv.Atoi(strings.TrimSpace(waitFile(t, pidFile)))
	killLater(t, child)
	st, _ := tb.tasks.Status(id)
	r, v = taskCall(t, tb, "task_cancel", map[string]any{"task_id": id})
	if r.IsError || v.State != tasks.Cancelled || !strings.Contains(resultTextOf(r), "cancelled with task_cancel") {
		t.Fatalf("cancel: %s", resultTextOf(r))
	}
	if !processGone(child) || !processGroupGone(st.PID) {
		t.Fatalf("the task's processes survived the cancel")
	}
	// Cancelling again says it has ended.
	r, _ = taskCall(t, tb, "task_cancel", map[string]any{"task_id": id})
	if !r.IsError || !strings.Contains(resultTextOf(r), "has ended already") {
		t.Fatalf("second cancel: %s", resultTextOf(r))
	}
}

// A task that writes more than its output cap is killed.
func TestTaskOutputCap(t *testing.T) {
	tb := taskBox(t, "", func(c *tasks.Config) { c.MaxOutputBytes = 256 << 10 })
	id := startTask(t, tb, "while :; do echo 0123456789abcdef0123456789abcdef; done", nil)
	r, v := waitTask(t, tb, id)
	if v.State != tasks.Failed || !strings.Contains(v.Note, "output passed the limit of 256.0 KiB") {
		t.Fatalf("state %s: %s", v.State, resultTextOf(r))
	}
	// The cap is checked often once the output nears it: what passes it
	// is what the command writes in a few milliseconds.
	t.Logf("output when killed: %d bytes, cap %d", v.OutputBytes, 256<<10)
	if v.OutputBytes <= 256<<10 || v.OutputBytes > 64<<20 {
		t.Fatalf("output of %d bytes", v.OutputBytes)
	}
	if v.OutputTail == nil || len(*v.OutputTail) > 8<<10 || strings.Count(*v.OutputTail, "\n") > 50 {
		t.Fatalf("tail not capped: %d bytes", len(*v.OutputTail))
	}
}

// Beyond MaxRunning tasks, tasks queue; beyond the queue, a busy error
// names the limits; a slot freed starts the next task.
func TestTaskBusyLimits(t *testing.T) {
	tb := taskBox(t, "", func(c *tasks.Config) { c.MaxRunning, c.MaxQueued = 1, 1 })
	first := startTask(t, tb, "sleep 30", nil)
	r, v := taskCall(t, tb, "bash", map[string]any{"command": "echo second", "background": true})
	if v.State != tasks.Queued || v.QueuePosition != 1 || !strings.Contains(resultTextOf(r), "Queued background task") {
		t.Fatalf("second: %s", resultTextOf(r))
	}
	second := v.TaskID
	r, _ = taskCall(t, tb, "bash", map[string]any{"command": "echo third", "background": true})
	if r.Error == nil || r.Error.Code != protocol.CodeBusy || !strings.Contains(r.Error.Message, "--max_tasks 1, --max_task_queue 1") {
		t.Fatalf("third: %+v %s", r.Error, resultTextOf(r))
	}
	if ids, _ := tb.tasks.List(); len(ids) != 2 {
		t.Fatalf("a refused task left a folder: %v", ids)
	}
	_, v = taskCall(t, tb, "task_status", map[string]any{"task_id": second, "wait": 0})
	if v.State != tasks.Queued || !strings.Contains(statusText(v), "position 1") {
		t.Fatalf("queued status: %s", statusText(v))
	}
	taskCall(t, tb, "task_cancel", map[string]any{"task_id": first})
	_, v = waitTask(t, tb, second)
	if v.State != tasks.Succeeded || *v.OutputTail != "second\n" {
		t.Fatalf("queued task after the slot freed: %s", statusText(v))
	}

	// A queued task can be cancelled; it never runs.
	startTask(t, tb, "sleep 30", nil)
	queued := startTask(t, tb, "echo never > ran.txt", nil)
	r, v = taskCall(t, tb, "task_cancel", map[string]any{"task_id": queued})
	if r.IsError || v.State != tasks.Cancelled || !strings.Contains(v.Note, "never ran") {
		t.Fatalf("cancel queued: %s", resultTextOf(r))
	}
	if _, err := os.Stat(filepath.Join(tb.cfg.Cwd, "ran.txt")); err == nil {
		t.Fatal("a cancelled queued task ran")
	}
}

// A task started by one agent is found running by the next one on the
// same state directory, which watches it to its end; a task that ended
// while no agent ran is recorded with its exit code.
func TestTaskReattach(t *testing.T) {
	first := taskBox(t, "", nil)
	cwd := first.cfg.Cwd
	running := startTask(t, first, "while [ ! -e gate ]; do sleep 0.02; done; echo done; exit 7", nil)
	quick := startTask(t, first, "while [ ! -e gate2 ]; do sleep 0.02; done; echo quick", nil)
	first.tasks.Close() // the agent goes away; its tasks do not

	// quick ends while no agent watches.
	os.WriteFile(filepath.Join(cwd, "gate2"), nil, 0o600)
	waitFile(t, filepath.Join(filepath.Dir(first.tasks.OutputFile(quick)), "exit"))

	second := taskBox(t, first.cfg.StateDir, nil)
	_, v := taskCall(t, second, "task_status", map[string]any{"task_id": running, "wait": 0})
	if v.State != tasks.Running {
		t.Fatalf("after restart: %s", statusText(v))
	}
	_, v = taskCall(t, second, "task_status", map[string]any{"task_id": quick, "wait": 0})
	if v.State != tasks.Succeeded || *v.ExitCode != 0 || !strings.Contains(v.Note, "no agent was running") {
		t.Fatalf("task that ended meanwhile: %s", statusText(v))
	}
	os.WriteFile(filepath.Join(cwd, "gate"), nil, 0o600)
	_, v = waitTask(t, second, running)
	if v.State != tasks.Failed || *v.ExitCode != 7 || !v.Reattached || *v.OutputTail != "done\n" {
		t.Fatalf("re-attached task: %s", statusText(v))
	}

	// The next agent keeps enforcing the deadline.
	third := taskBox(t, second.cfg.StateDir, nil)
	timed := startTask(t, third, "sleep 300", map[string]any{"timeout": 1.5})
	third.tasks.Close()
	fourth := taskBox(t, third.cfg.StateDir, nil)
	_, v = waitTask(t, fourth, timed)
	if v.State != tasks.TimedOut || !v.Reattached {
		t.Fatalf("deadline after re-attach: %s", statusText(v))
	}
}

// A task whose process died while no agent ran, leaving no exit code, is
// lost (a PID reused meanwhile: agent/tasks TestLostWhenPIDReused).
func TestTaskLost(t *testing.T) {
	first := taskBox(t, "", nil)
	id := startTask(t, first, "sleep 300", nil)
	first.tasks.Close()
	st, _ := first.tasks.Status(id)
	syscall.Kill(-st.PID, syscall.SIGKILL)
	if !processGone(st.PID) {
		t.Fatal("the task did not die")
	}

	second := taskBox(t, first.cfg.StateDir, nil)
	_, v := taskCall(t, second, "task_status", map[string]any{"task_id": id, "wait": 0})
	if v.State != tasks.Lost || !strings.Contains(v.Note, "process was gone") {
		t.Fatalf("killed while no agent ran: %s", statusText(v))
	}
}

// Retention runs when a task starts, through the tool.
func TestTaskRetentionOnStart(t *testing.T) {
	tb := taskBox(t, "", func(c *tasks.Config) { c.MaxKept = 3 })
	var ids []string
	for i := range 5 {
		id := startTask(t, tb, fmt.Sprintf("echo %d", i), nil)
		waitTask(t, tb, id)
		ids = append(ids, id)
	}
	got, _ := tb.tasks.List()
	if fmt.Sprint(got) != fmt.Sprint(ids[2:]) {
		t.Fatalf("kept %v, want the newest three %v", got, ids[2:])
	}
	r, _ := taskCall(t, tb, "task_status", map[string]any{"task_id": ids[0]})
	if !r.IsError || !strings.Contains(resultTextOf(r), "retention removed it") {
		t.Fatalf("status of a removed task: %s", resultTextOf(r))
	}
}

func TestTaskList(t *testing.T) {
	tb := taskBox(t, "", nil)
	a := startTask(t, tb, "exit 1", nil)
	waitTask(t, tb, a)
	b := startTask(t, tb, "sleep 30", nil)
	c := startTask(t, tb, "echo   spaced\n  out", nil)
	waitTask(t, tb, c)

	r, _ := tbCall(t, context.Background(), tb, "task_list", map[string]any{})
	var list struct {
		Tasks   []taskView `json:"tasks"`
		Matched int        `json:"matched"`
	}
	if err := json.Unmarshal(r.Structured, &list); err != nil {
		t.Fatal(err)
	}
	if list.Matched != 3 || len(list.Tasks) != 3 || list.Tasks[0].TaskID != c || list.Tasks[2].TaskID != a {
		t.Fatalf("list: %s", resultTextOf(r))
	}
	if !strings.Contains(resultTextOf(r), "echo spaced out") {
		t.Errorf("commands are not shown on one line: %s", resultTextOf(r))
	}
	r, _ = tbCall(t, context.Background(), tb, "task_list", map[string]any{"state": "running"})
	if !strings.HasPrefix(resultTextOf(r), "1 running tasks on test-host") || !strings.Contains(resultTextOf(r), b) {
		t.Fatalf("running: %s", resultTextOf(r))
	}
	r, _ = tbCall(t, context.Background(), tb, "task_list", map[string]any{"limit": 1})
	if !strings.Contains(resultTextOf(r), "newest 1 shown") || strings.Contains(resultTextOf(r), a) {
		t.Fatalf("limit 1: %s", resultTextOf(r))
	}
}

func TestTaskToolsBadArgs(t *testing.T) {
	tb := taskBox(t, "", nil)
	tests := []struct {
		tool string
		args map[string]any
		want string
	}{
		{"task_status", map[string]any{"task_id": "../../etc"}, "not a task ID"},
		{"task_status", map[string]any{}, "not a task ID"},
		{"task_status", map[string]any{"task_id": "t20260514-093012-123456-9f3a1c2e", "wait": -1}, "from 0 to 60"},
		{"task_status", map[string]any{"task_id": "t20260514-093012-123456-9f3a1c2e", "tail": 3}, "unknown field"},
		{"task_cancel", map[string]any{"task_id": "T20260514-093012-123456-9f3a1c2e"}, "position 1"},
		{"task_list", map[string]any{"state": "done"}, "queued, running, succeeded"},
		{"task_list", map[string]any{"limit": 0}, "at least 1"},
		{"bash", map[string]any{"command": "true", "background": true, "timeout": 0}, "positive"},
	}
	for _, tt := range tests {
		r, _ := tbCall(t, context.Background(), tb, tt.tool, tt.args)
		tbBadArgs(t, r, tt.want)
	}
	r, _ := tbCall(t, context.Background(), tb, "task_status", map[string]any{"task_id": "t20260514-093012-123456-9f3a1c2e"})
	if !r.IsError || !strings.Contains(resultTextOf(r), "no task t20260514-093012-123456-9f3a1c2e on test-host") {
		t.Fatalf("unknown task: %s", resultTextOf(r))
	}
	// A timeout above the maximum is capped.
	r, v := taskCall(t, tb, "bash", map[string]any{"command": "true", "background": true, "timeout": 1e9})
	if r.IsError || v.TimeoutSeconds != 24*3600 {
		t.Fatalf("huge timeout: %s", resultTextOf(r))
	}
}

// Background commands pass the host policy like any other.
func TestTaskBackgroundPolicy(t *testing.T) {
	tb := tbPolicy(t, "bash: {allow: [\"echo *\"]}\n").toolbox
	if err := tb.tasks.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tb.tasks.Close)
	r, _ := tbCall(t, context.Background(), tb, "bash", map[string]any{"command": "rm -rf x", "background": true})
	if r.Error == nil || r.Error.Code != protocol.CodeDenied {
		t.Fatalf("denied command in the background: %+v %s", r.Error, resultTextOf(r))
	}
	if ids, _ := tb.tasks.List(); len(ids) != 0 {
		t.Fatalf("a refused command created a task: %v", ids)
	}
}

// Before the manager opens and once it closes, tasks are refused and
// waits end.
func TestTaskManagerClosed(t *testing.T) {
	tb := tbNew(t)
	r, _ := tbCall(t, context.Background(), tb, "bash", map[string]any{"command": "true", "background": true})
	if r.Error == nil || r.Error.Code != protocol.CodeShuttingDown {
		t.Fatalf("before open: %+v", r)
	}
	tb = taskBox(t, "", nil)
	id := startTask(t, tb, "sleep 30", nil)
	var wg sync.WaitGroup
	var v taskView
	wg.Go(func() { _, v = taskCall(t, tb, "task_status", map[string]any{"task_id": id, "wait": 60}) })
	waitTaskWaits(t, tb, 1)
	start := time.Now()
	tb.tasks.BeginClose()
	wg.Wait()
	if v.State != tasks.Running || time.Since(start) > 10*time.Second {
		t.Fatalf("wait during shutdown: %s after %s", v.State, time.Since(start))
	}
}

// A task whose process cannot start fails at once and says why.
func TestTaskCannotStart(t *testing.T) {
	tb := taskBox(t, "", nil)
	if err := os.Remove(tb.cfg.Cwd); err != nil {
		t.Fatal(err)
	}
	r, v := taskCall(t, tb, "bash", map[string]any{"command": "true", "background": true})
	if !r.IsError || v.State != tasks.Failed || !strings.Contains(resultTextOf(r), "could not start") || !strings.Contains(v.Note, "no such file") {
		t.Fatalf("start in a missing directory: %s", resultTextOf(r))
	}
	// The slot it would have used is free.
	n := tb.tasks.RunningCount()
	if n != 0 {
		t.Fatalf("%d tasks still count as running", n)
	}
}
