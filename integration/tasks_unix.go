//go:build unix

package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Background tasks, as a client drives them.

// StartBackground starts command as a background task on host and returns
// its task ID and output file.
func StartBackground(t *testing.T, cs *mcp.ClientSession, host, command string, extra map[string]any) (id, output string) {
	t.Helper()
	args := map[string]any{"host": host, "command": command, "background": true}
	for k, v := range extra {
		args[k] = v
	}
	res := Call(t, cs, "bash", args)
	MustOK(t, res)
	st := Structured(t, res)
	id, _ = st["task_id"].(string)
	output, _ = st["output_file"].(string)
	if id == "" || output == "" || st["host"] != host {
		t.Fatalf("background start: %s %v", Text(res), st)
	}
	return id, output
}

// TaskStatus calls task_status and returns its structured content.
func TaskStatus(t *testing.T, cs *mcp.ClientSession, host, id string, wait float64) (map[string]any, *mcp.CallToolResult) {
	t.Helper()
	res := Call(t, cs, "task_status", map[string]any{"host": host, "task_id": id, "wait": wait})
	MustOK(t, res)
	return Structured(t, res), res
}

// AwaitTask waits (server-side, repeatedly) until task id has ended, for
// at most two minutes.
func AwaitTask(t *testing.T, cs *mcp.ClientSession, host, id string) (map[string]any, *mcp.CallToolResult) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, res := TaskStatus(t, cs, host, id, 20)
		if s := st["state"]; s != "queued" && s != "running" {
			return st, res
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s still %v after two minutes", id, st["state"])
		}
	}
}

// KillTasksAfter kills, when the test ends, every task still running
// under the agent whose working directory is dir, so that a failing test
// leaves no process behind. A recorded PID is killed only while its
// command line still names the task's folder.
func KillTasksAfter(t *testing.T, dir string) {
	t.Cleanup(func() {
		files, _ := filepath.Glob(filepath.Join(dir, ".state", "tasks", "*", "status.json"))
		for _, f := range files {
			var st struct {
				State string `json:"state"`
				PID   int    `json:"pid"`
			}
			data, err := os.ReadFile(f)
			if err != nil || json.Unmarshal(data, &st) != nil || st.State != "running" || st.PID <= 0 {
				continue
			}
			cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(st.PID) + "/cmdline")
			if err == nil && strings.Contains(string(cmdline), filepath.Dir(f)) {
				syscall.Kill(-st.PID, syscall.SIGKILL)
			}
		}
	})
}
