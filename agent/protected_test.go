//go:build unix

package agent

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestProtectedPaths: a protected directory (here, as in fleet-gateway
// --dev, one that holds the agent's own state directory) and a protected
// file are kept from every file tool however a path reaches them, also
// under a restricted policy's allow rules and through a hard link; the
// bash full-output files in the state directory stay readable.
func TestProtectedPaths(t *testing.T) {
	cwd, data := t.TempDir(), t.TempDir()
	creds := tbFile(t, data, "credentials.json", `{"agent_key":"K3Y"}`+"\n")
	tbFile(t, data, "jetstream/stream.dat", "K3Y\n")
	tb, err := newToolbox(toolboxConfig{
		Cwd: cwd, StateDir: filepath.Join(data, "agent"), Shell: "/bin/sh",
		BashDefaultTimeout: 10 * time.Second, BashMaxTimeout: time.Minute, ChildEnv: os.Environ(),
		ProtectedPaths: []string{data, creds},
	})
	if err != nil {
		t.Fatal(err)
	}
	g := guarded{toolbox: tb, cwd: cwd}
	g.link(t, data, "data-link")
	g.link(t, creds, "creds-link")
	g.link(t, filepath.Join(data, "new.txt"), "dangling-into-data")
	if err := os.Link(creds, filepath.Join(cwd, "hard.json")); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(cwd, creds)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"read", map[string]any{"path": creds}, "a protected path"},
		{"read", map[string]any{"path": rel}, "a protected path"},
		{"read", map[string]any{"path": filepath.Join(data, "agent", "..", "credentials.json")}, "a protected path"},
		{"read", map[string]any{"path": "creds-link"}, "a protected path"},
		{"read", map[string]any{"path": "data-link/jetstream/stream.dat"}, "a protected path"},
		{"read", map[string]any{"path": "hard.json"}, "a protected file under another name"},
		{"read", map[string]any{"path": "hard.json", "binary_base64": true}, "a protected file under another name"},
		{"search", map[string]any{"path": "hard.json", "query": "K3Y"}, "a protected file under another name"},
		{"search", map[string]any{"path": "data-link", "query": "K3Y"}, "a protected path"},
		{"list", map[string]any{"path": data}, "a protected path"},
		{"list", map[string]any{"path": "data-link/jetstream"}, "a protected path"},
		{"write", map[string]any{"path": "data-link/new.txt", "content": "x"}, "a protected path"},
		{"write", map[string]any{"path": "dangling-into-data", "content": "x"}, "a protected path"},
		{"edit", map[string]any{"path": "creds-link", "edits": []map[string]any{{"old_string": "K3Y", "new_string": "x"}}}, "a protected path"},
		{"patch", map[string]any{"patch": "--- a/" + rel + "\n+++ b/" + rel + "\n@@ -1 +1 @@\n-{\"agent_key\":\"K3Y\"}\n+{}\n"}, "a protected path"},
		{"patch", map[string]any{"patch": "--- /dev/null\n+++ b/dangling-into-data\n@@ -0,0 +1 @@\n+x\n"}, "a protected path"},
		{"delete", map[string]any{"path": "data-link/credentials.json"}, "a protected path"},
		{"delete", map[string]any{"path": filepath.Dir(data), "recursive": true}, "belongs to the agent"},
		{"move", map[string]any{"path": creds, "destination": "stolen.json"}, "a protected path"},
		{"move", map[string]any{"path": "hard.json", "destination": "data-link/planted.json"}, "a protected path"},
	} {
		r := run(t, g.toolbox, tt.tool, tt.args)
		wantDenied(t, tt.tool+" "+tbArgs(tt.args), r, tt.want)
		if r.Error == nil && strings.Contains(tbText(t, r), "K3Y") {
			t.Errorf("%s %s revealed the protected content", tt.tool, tbArgs(tt.args))
		}
	}
	// Walks of a tree holding links into the protected paths do not
	// follow them.
	if r := tbText(t, run(t, g.toolbox, "search", map[string]any{"query": "K3Y"})); !strings.HasPrefix(r, "No matches") {
		t.Errorf("search of the working directory reached a protected file:\n%s", r)
	}
	if r := tbText(t, run(t, g.toolbox, "list", map[string]any{"depth": 5})); strings.Contains(r, "stream.dat") || strings.Contains(r, "jetstream") {
		t.Errorf("list of the working directory reached a protected path:\n%s", r)
	}
	if got := tbRead(t, creds); got != `{"agent_key":"K3Y"}`+"\n" || tbExists(t, filepath.Join(data, "new.txt")) {
		t.Error("a protected path changed")
	}

	// The agent's own full outputs, in its state directory inside the
	// protected one, are still handed out.
	r := run(t, g.toolbox, "bash", map[string]any{"command": "seq 1 30000"})
	full := regexp.MustCompile(`Full output: ([^\s\]]+)`).FindStringSubmatch(tbText(t, r))
	if full == nil || !strings.HasPrefix(full[1], data) {
		t.Fatalf("no full-output file under the protected directory:\n%s", tbText(t, r))
	}
	wantAllowed(t, "read the full output", run(t, g.toolbox, "read", map[string]any{"path": full[1], "offset": 29999}))
}
