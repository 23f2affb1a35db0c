package integration

import (
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunnersThroughAgent: programs that run a program (split --filter,
// fakeroot, prlimit, ssh-agent, capsh, sg, strace), a variable that makes
// python import a module, and git's submodule helper run a payload on
// an unrestricted host; on a host whose policy denies the payload's
// command, the same lines are refused through the gateway and the payload
// never runs.
func TestRunnersThroughAgent(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"free"}})
	policyHost(t, env, "denied", `bash: {deny: ["touch *", "git push *"]}`)
	group := "root"
	if g, err := user.Current(); err == nil {
		if grp, err := user.LookupGroupId(g.Gid); err == nil {
			group = grp.Name
		}
	}
	lines := []struct {
		program string // must be installed for the line to run
		line    string // MARKER stands for the file the payload makes
	}{
		{"split", "printf 'a\\n' > DIR/in && split -l 1 --filter='touch MARKER' DIR/in DIR/part"},
		{"fakeroot", "fakeroot touch MARKER"},
		{"prlimit", "prlimit --nofile=100 touch MARKER"},
		{"ssh-agent", "ssh-agent touch MARKER"},
		{"capsh", "capsh -- -c 'touch MARKER'"},
		{"sg", "sg " + group + " -c 'touch MARKER'"},
		{"strace", "strace -f -o /dev/null touch MARKER"},
		{"python3", "PYTHONPATH=DIR PYTHONWARNINGS=ignore::evilmod.Warning python3 -c 1"},
		{"git", "git -C DIR/repo submodule--helper foreach 'touch MARKER'"},
	}
	cs := env.Client("", nil)
	for i, l := range lines {
		if _, err := exec.LookPath(l.program); err != nil {
			t.Logf("%s is not installed: skipping %q", l.program, l.line)
			continue
		}
		for _, host := range []string{"free", "denied"} {
			dir := t.TempDir()
			marker := filepath.Join(dir, "marker")
			writeFile(t, filepath.Join(dir, "evilmod.py"), "open("+pyQuote(marker)+", 'w').close()\nclass Warning(UserWarning): pass\n")
			if l.program == "git" {
				submoduleRepo(t, filepath.Join(dir, "repo"))
			}
			line := strings.NewReplacer("MARKER", marker, "DIR", dir).Replace(l.line)
			res := call(t, cs, "bash", map[string]any{"host": host, "command": line})
			_, err := os.Stat(marker)
			switch {
			case host == "free" && err != nil:
				t.Logf("%d: %q did not run its payload on the unrestricted host (%s): the refusal below proves less", i, line, text(res))
			case host == "denied":
				mustErr(t, res, "denied by host policy")
				if err == nil {
					t.Errorf("%q ran its payload on the host that denies it", line)
				}
			}
		}
	}
}

// submoduleRepo makes dir a repository with one submodule.
func submoduleRepo(t *testing.T, dir string) {
	t.Helper()
	lib := dir + "-lib"
	for _, args := range [][]string{
		{"init", "-q", lib}, {"-C", lib, "commit", "-q", "--allow-empty", "-m", "lib"},
		{"init", "-q", dir}, {"-C", dir, "-c", "protocol.file.allow=always", "submodule", "add", "-q", lib, "lib"},
		{"-C", dir, "commit", "-q", "-m", "sub"},
	} {
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %q: %v\n%s", args, err, out)
		}
	}
}

func pyQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `\'`) + "'" }
