package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent"
)

// TestGitGuard: a caller who can write files on a machine plants git
// configuration that names a program, then runs a git command a
// restricted policy allows. Through the gateway, the program never runs,
// and the caller is told why.
func TestGitGuard(t *testing.T) {
	// The machine's own git configuration stays out of the test.
	t.Setenv("HOME", t.TempDir())
	t.Setenv("GIT_CONFIG_NOSYSTEM", "1")
	env := NewEnv(t, Options{Agents: []string{}})
	shared := t.TempDir()
	marker := filepath.Join(t.TempDir(), "marker")
	hook := "touch " + marker + "; true" // core.fsmonitor runs through a shell
	readOnly := profileText(t, "read-only.yaml")
	start := func(name, dir, policy string, mod func(*agent.Config)) {
		file := filepath.Join(t.TempDir(), "policy.yaml")
		if err := os.WriteFile(file, []byte(policy), 0o600); err != nil {
			t.Fatal(err)
		}
		env.StartAgent(name, func(c *agent.Config) {
			c.Cwd, c.StateDir = dir, filepath.Join(t.TempDir(), "state")
			if policy != "" {
				c.PolicyFile = file
			}
			if mod != nil {
				mod(c)
			}
		})
		env.WaitHost(name, true)
	}
	// Two agents on one machine: one may write files, one may only read.
	start("writer", shared, "", nil)
	start("reader", shared, readOnly, nil)
	start("unguarded", shared, readOnly, func(c *agent.Config) { c.GitGuard = "" })
	workspace := t.TempDir()
	start("project", workspace, profileText(t, "workspace.yaml"), nil)
	cs := env.Client("2025-11-25", nil)

	write := func(host, path, content string) {
		t.Helper()
		mustOK(t, call(t, cs, "write", map[string]any{"host": host, "path": path, "content": content}))
	}
	gitDir := func(host, dir, extra string) {
		write(host, dir+"/HEAD", "ref: refs/heads/main\n")
		write(host, dir+"/config", "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"+extra+"\tfsmonitor = "+hook+"\n")
		write(host, dir+"/objects/.keep", "")
		write(host, dir+"/refs/heads/.keep", "")
	}
	ran := func() bool {
		_, err := os.Stat(marker)
		os.Remove(marker)
		return err == nil
	}

	// A .git written through one host, git status through the other.
	gitDir("writer", ".git", "")
	res := call(t, cs, "bash", map[string]any{"host": "reader", "command": "git status"})
	if ran() {
		t.Fatalf("git status on the read-only host ran the repository's core.fsmonitor: %s", text(res))
	}
	mustErr(t, res, "core.fsmonitor")
	mustErr(t, res, "bash.git.allow_config")
	// An agent with no guard refuses git under command rules.
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "unguarded", "command": "git status"}), "git is refused on this host")

	// The workspace keeps the file tools out of .git; a git directory
	// elsewhere, with core.worktree pointing back, is refused by git's
	// guard instead.
	mustErr(t, call(t, cs, "write", map[string]any{"host": "project", "path": ".git/config", "content": "x"}), "denied by host policy")
	gitDir("project", "x", "\tworktree = ..\n")
	res = call(t, cs, "bash", map[string]any{"host": "project", "command": "git --git-dir=x status"})
	if ran() {
		t.Fatalf("git --git-dir=x status ran the planted core.fsmonitor: %s", text(res))
	}
	mustErr(t, res, "core.fsmonitor")

	// Without the setting, git works as before.
	write("project", "x/config", "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = ..\n")
	if out := mustOK(t, call(t, cs, "bash", map[string]any{"host": "project", "command": "git --git-dir=x status --short"})); !strings.Contains(out, "?? ") {
		t.Errorf("git status in a plain repository: %s", out)
	}
}

// profileText returns a shipped host policy.
func profileText(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "deploy", "policies", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
