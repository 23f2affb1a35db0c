//go:build unix

package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/tasks"
)

// TestBashCwd: a call's cwd is resolved like a file tool's path (relative
// to the agent's directory, through links) and must be a directory the
// host policy lets the tools read; the command runs there, in the
// foreground and as a background task.
func TestBashCwd(t *testing.T) {
	g := tbPolicy(t, `paths: {read: {deny: ["CWD/secret"]}}`)
	if err := g.tasks.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.tasks.Close)
	mkdirs(t, filepath.Join(g.cwd, "sub", "deeper"), filepath.Join(g.cwd, "secret"))
	g.file(t, "file.txt", "x\n")
	g.link(t, filepath.Join(g.cwd, "secret"), "innocent")
	other := t.TempDir()

	for _, tt := range []struct{ cwd, want string }{
		{"sub", filepath.Join(g.cwd, "sub")},
		{"sub/deeper/..", filepath.Join(g.cwd, "sub")},
		{other, other},
		{"", g.cwd},
	} {
		r := run(t, g.toolbox, "bash", map[string]any{"command": "pwd -P; echo $PWD", "cwd": tt.cwd})
		real, _ := filepath.EvalSymlinks(tt.want)
		if got := tbText(t, r); got != real+"\n"+real+"\n" {
			t.Errorf("cwd %q: output %q, want %q twice", tt.cwd, got, real)
		}
	}
	for _, tt := range []struct{ cwd, want string }{
		{"secret", "paths.read.deny"},
		{"innocent", "paths.read.deny"},
		{g.state, "belongs to the agent"},
	} {
		wantDenied(t, "cwd "+tt.cwd, run(t, g.toolbox, "bash", map[string]any{"command": "pwd", "cwd": tt.cwd}), tt.want)
		wantDenied(t, "background cwd "+tt.cwd, run(t, g.toolbox, "bash", map[string]any{"command": "pwd", "cwd": tt.cwd, "background": true}), tt.want)
	}
	for _, tt := range []struct{ cwd, want string }{
		{"file.txt", "is not a directory"},
		{"missing", "no such file"},
	} {
		r := run(t, g.toolbox, "bash", map[string]any{"command": "pwd", "cwd": tt.cwd})
		if !r.IsError || !strings.Contains(resultText(t, r), tt.want) {
			t.Errorf("cwd %q: %+v, want an error saying %q", tt.cwd, r, tt.want)
		}
	}

	r := run(t, g.toolbox, "bash", map[string]any{"command": "pwd -P > where.txt", "cwd": "sub", "background": true})
	wantAllowed(t, "background", r)
	var v struct {
		TaskID string `json:"task_id"`
	}
	if err := json.Unmarshal(r.Structured, &v); err != nil {
		t.Fatalf("structured %s: %v", r.Structured, err)
	}
	st, _, err := g.tasks.Await(t.Context(), v.TaskID, 10*time.Second)
	if err != nil || st.State != tasks.Succeeded {
		t.Fatalf("task %s: %+v, %v", v.TaskID, st, err)
	}
	data, err := os.ReadFile(filepath.Join(g.cwd, "sub", "where.txt"))
	real, _ := filepath.EvalSymlinks(filepath.Join(g.cwd, "sub"))
	if err != nil || string(data) != real+"\n" {
		t.Errorf("the background task ran in %q (%v), want %s", data, err, real)
	}
}

// TestBashCwdRedirect: relative redirection targets are checked against
// the call's cwd, where the shell opens them, not the agent's directory.
func TestBashCwdRedirect(t *testing.T) {
	g := tbPolicy(t, `paths: {write: {allow: ["CWD/work/**"]}}`)
	mkdirs(t, filepath.Join(g.cwd, "work"), filepath.Join(g.cwd, "outside"))
	wantAllowed(t, "inside", run(t, g.toolbox, "bash", map[string]any{"command": "echo x > out.txt", "cwd": "work"}))
	if _, err := os.Stat(filepath.Join(g.cwd, "work", "out.txt")); err != nil {
		t.Errorf("the allowed redirection did not write work/out.txt: %v", err)
	}
	r := run(t, g.toolbox, "bash", map[string]any{"command": "echo x > out.txt", "cwd": "outside"})
	wantDenied(t, "outside", r, filepath.Join(g.cwd, "outside", "out.txt"))
	if _, err := os.Lstat(filepath.Join(g.cwd, "outside", "out.txt")); !os.IsNotExist(err) {
		t.Errorf("the refused line ran: %v", err)
	}
}
