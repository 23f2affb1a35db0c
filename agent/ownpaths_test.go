//go:build unix

package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The tools that act on entries and trees (delete, move, patch, list,
// search) keep off the agent's own files however a path reaches them:
// through a link in a parent, a dangling link, "..", a link inside a
// tree that is deleted or moved.
func TestTreeToolsOwnFilesThroughLinks(t *testing.T) {
	g := tbPolicy(t, "# unrestricted\n")
	if err := os.MkdirAll(filepath.Join(g.state, "output"), 0o700); err != nil {
		t.Fatal(err)
	}
	internal := tbFile(t, g.state, "tasks.json", "{}\n")
	g.link(t, g.state, "state-link")
	g.link(t, filepath.Join(g.state, "new.txt"), "dangling-into-state")
	g.link(t, filepath.Dir(g.policyFile), "own-link")
	g.file(t, "a.txt", "a\n")
	g.file(t, "tree/x.txt", "x\n")
	g.link(t, g.state, "tree/state-link")
	g.link(t, g.policyFile, "tree/policy-link")
	rel, err := filepath.Rel(g.cwd, g.policyFile)
	if err != nil {
		t.Fatal(err)
	}
	policyText := tbRead(t, g.policyFile)

	for _, tt := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"delete", map[string]any{"path": "state-link/tasks.json"}, "its state directory"},
		{"delete", map[string]any{"path": "own-link/policy.yaml"}, "its policy file"},
		{"delete", map[string]any{"path": "own-link/state", "recursive": true}, "its state directory"},
		{"move", map[string]any{"path": "state-link/tasks.json", "destination": "t.json"}, "its state directory"},
		{"move", map[string]any{"path": "a.txt", "destination": "state-link/a.txt"}, "its state directory"},
		{"move", map[string]any{"path": "a.txt", "destination": "own-link/policy.yaml"}, "its policy file"},
		{"move", map[string]any{"path": "own-link/state", "destination": "s"}, "its state directory"},
		{"patch", map[string]any{"patch": "--- /dev/null\n+++ b/dangling-into-state\n@@ -0,0 +1 @@\n+x\n"}, "its state directory"},
		{"patch", map[string]any{"patch": "--- a/" + rel + "\n+++ b/" + rel + "\n@@ -1 +1 @@\n-" + strings.TrimSuffix(policyText, "\n") + "\n+tools: {deny: [bash]}\n"}, "its policy file"},
		{"patch", map[string]any{"patch": "--- a/x/../own-link/policy.yaml\n+++ b/x/../own-link/policy.yaml\n@@ -1 +1 @@\n-" + strings.TrimSuffix(policyText, "\n") + "\n+x\n"}, "its policy file"},
		{"list", map[string]any{"path": "state-link"}, "its state directory"},
		{"search", map[string]any{"path": "state-link", "query": "{"}, "its state directory"},
		{"move", map[string]any{"path": "own-link", "destination": "x/y"}, ""}, // the link itself
	} {
		r := run(t, g.toolbox, tt.tool, tt.args)
		if tt.want == "" {
			wantAllowed(t, tt.tool+" "+tbArgs(tt.args), r)
			continue
		}
		wantDenied(t, tt.tool+" "+tbArgs(tt.args), r, tt.want)
	}

	// Links inside a tree are entries of the tree: deleting or moving
	// it takes the links, never what they lead to.
	wantAllowed(t, "move a tree holding links to the agent's files", run(t, g.toolbox, "move", map[string]any{"path": "tree", "destination": "tree2"}))
	wantAllowed(t, "delete a tree holding links to the agent's files", run(t, g.toolbox, "delete", map[string]any{"path": "tree2", "recursive": true}))
	// Search and list never follow them.
	g.link(t, g.state, "state-link2")
	r := run(t, g.toolbox, "search", map[string]any{"query": "{}"})
	if strings.Contains(tbText(t, r), "tasks.json") {
		t.Errorf("search followed a link into the state directory:\n%s", tbText(t, r))
	}
	r = run(t, g.toolbox, "list", map[string]any{"depth": 3})
	if strings.Contains(tbText(t, r), "tasks.json") {
		t.Errorf("list followed a link into the state directory:\n%s", tbText(t, r))
	}
	if tbRead(t, internal) != "{}\n" || tbRead(t, g.policyFile) != policyText || tbExists(t, filepath.Join(g.state, "new.txt")) {
		t.Error("the agent's own files changed")
	}
}

func tbArgs(args map[string]any) string {
	var b strings.Builder
	for k, v := range args {
		s, _ := v.(string)
		b.WriteString(k + "=" + protocol.Ellipsis(s, 40) + " ")
	}
	return b.String()
}
