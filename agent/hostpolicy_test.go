//go:build unix

package agent

import (
	"bytes"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestAgentPolicy runs an agent under a policy: refused tools are left
// out of its announce and answered with a denial, and the announce
// carries the policy's digest.
func TestAgentPolicy(t *testing.T) {
	const host = "pol-1"
	ns, nc, pres := watchedNATS(t)
	cwd := t.TempDir()
	file := filepath.Join(t.TempDir(), "policy.yaml")
	text := "tools: {deny: [write, edit, patch, skill, delete, move]}\nbash: {allow: [\"echo *\"]}\n"
	if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	runAgent(t, ns, Config{Name: host, Cwd: cwd, PolicyFile: file})

	a := nextAnnounce(t, pres, host, false)
	if !slices.Equal(a.Tools, []string{"bash", "list", "read", "search", "task_cancel", "task_list", "task_status"}) {
		t.Errorf("announced tools %q, want bash, list, read and search, and the task tools that come with bash", a.Tools)
	}
	want, err := policy.Parse([]byte(text), policy.Env{Cwd: cwd, Tools: toolNames()})
	if err != nil {
		t.Fatal(err)
	}
	if a.PolicyDigest == "" || a.PolicyDigest != want.Digest() {
		t.Errorf("announced digest %q, want %q", a.PolicyDigest, want.Digest())
	}

	res, _ := sendCall(t, nc, newCall(host, "w-1", "write", map[string]string{"path": "x", "content": "x"})).result(t, "w-1")
	wantCode(t, res, protocol.CodeDenied, "denied by host policy", "tool write", "tools.deny", "serves: bash, list, read, search")
	if _, err := os.Stat(filepath.Join(cwd, "x")); !os.IsNotExist(err) {
		t.Errorf("a refused write wrote: %v", err)
	}
	res, _ = sendCall(t, nc, newCall(host, "u-1", "frob", map[string]string{})).result(t, "u-1")
	wantCode(t, res, protocol.CodeUnknownTool, `"frob"`)
	res, _ = sendCall(t, nc, newCall(host, "b-1", "bash", map[string]string{"command": "echo hi; touch y"})).result(t, "b-1")
	wantCode(t, res, protocol.CodeDenied, "`touch y`", "bash.allow")
	res, _ = sendCall(t, nc, newCall(host, "b-2", "bash", map[string]string{"command": "echo hi"})).result(t, "b-2")
	if text := resultText(t, res); text != "hi\n" {
		t.Errorf("allowed command = %q", text)
	}
}

// An unrestricted agent announces every tool and no digest.
func TestAgentUnrestricted(t *testing.T) {
	a := newTestAgent(t, Config{})
	all := slices.Sorted(slices.Values(append(toolNames(), taskToolNames()...)))
	if got := slices.Sorted(maps.Keys(a.served().tools)); !slices.Equal(got, all) || len(a.served().refused) != 0 || a.served().pol.Digest() != "" {
		t.Errorf("tools %v, refused %v, digest %q", got, a.served().refused, a.served().pol.Digest())
	}
	if want := []string{"bash", "delete", "edit", "list", "move", "patch", "read", "search", "skill", "write"}; !slices.Equal(toolNames(), want) {
		t.Errorf("toolNames() = %v, want %v", toolNames(), want)
	}
}

// A policy file that cannot be used stops the agent with an error naming
// the file and the problem.
func TestNewRefusesBadPolicy(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		file string
		want []string
	}{
		{filepath.Join(dir, "missing.yaml"), []string{"host policy", "missing.yaml", "no such file"}},
		{write("typo.yaml", "tool: {deny: [write]}\n"), []string{"typo.yaml", `unknown key "tool"`}},
		{write("tool.yaml", "tools: {deny: [wrtie]}\n"), []string{"tool.yaml", `unknown tool "wrtie"`, "bash, delete, edit, list, move, patch, read, search, skill, write"}},
		{write("glob.yaml", "paths: {deny: ['/srv/[x']}\n"), []string{"glob.yaml", "not a valid glob"}},
		{dir, []string{"host policy", dir}},
	}
	for _, tt := range tests {
		_, err := New(Config{Servers: []string{"nats://127.0.0.1:1"}, Name: "bad-1", StateDir: t.TempDir(), Cwd: t.TempDir(),
			PolicyFile: tt.file, Logger: quietLogger()})
		if err == nil {
			t.Errorf("New with policy %s succeeded", tt.file)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("New with policy %s = %q, want it to mention %q", tt.file, err, w)
			}
		}
	}
}

// Every example policy loads in the agent, with its real tool names.
func TestDeployPoliciesLoad(t *testing.T) {
	files, err := filepath.Glob("../deploy/policies/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example policies: %v", err)
	}
	for _, f := range files {
		if _, err := loadPolicy(f, policy.Env{Cwd: "/srv/app", Home: "/home/agent", Tools: toolNames(), Shell: defaultShell()}); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// The startup log has one line per dimension.
func TestPolicyLog(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("tools: {deny: [edit]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		file string
		want []string
	}{
		{"", []string{"none given", "tools: unrestricted", "paths: unrestricted", "bash: unrestricted", "skills: unrestricted"}},
		{file, []string{"digest=sha256:", "tools: deny edit", "paths: unrestricted", "bash: unrestricted", "skills: unrestricted"}},
	} {
		var buf bytes.Buffer
		a := newTestAgent(t, Config{PolicyFile: tt.file})
		a.log = slog.New(slog.NewTextHandler(&buf, nil))
		a.logPolicy()
		for _, w := range tt.want {
			if !strings.Contains(buf.String(), w) {
				t.Errorf("policy %q: log does not mention %q:\n%s", tt.file, w, buf.String())
			}
		}
	}
}
