package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/confine"
	"github.com/fleetmcp/fleetmcp/agent/identity"
)

// startPolicyAgent runs a real fleet-agent for host in dir (its state in
// dir/.state) under the host policy text, with extra flags, and returns
// its process.
func startPolicyAgent(t *testing.T, env *Env, host, dir, policy string, extra ...string) *os.Process {
	t.Helper()
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, policyFile, policy)
	cmd := env.AgentCommand(host, dir, append([]string{"--policy", policyFile}, extra...)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { stopProcess(cmd, done) })
	env.WaitHost(host, true)
	return cmd.Process
}

func stopProcess(cmd *exec.Cmd, done <-chan struct{}) {
	_ = cmd.Process.Signal(os.Interrupt)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// A caller whose host policy allows only the workspace and "cat *" (and
// "ln -s *", to plant links) tries every way to the host's key seed:
// its path, "..", /proc/self/cwd, a link it makes in the workspace, the
// agent's own root and file descriptors in /proc, a background task. A
// real fleet-agent confines its commands, so none reads it, while the
// workspace stays readable; with confinement off (what every agent did
// before) the first attempt prints the seed. hosts says which host is
// which.
func TestCommandsCannotReadHostIdentity(t *testing.T) {
	if abi, why := confine.ABI(); abi == 0 {
		t.Skipf("this kernel cannot confine commands: %s", why)
	}
	env := NewEnv(t, Options{Agents: []string{}})
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "notes.txt"), "workspace notes\n")
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf("paths: {allow: [%q]}\nbash: {allow: [\"cat *\", \"ln -s *\"]}\n", dir+"/**")
	agentProc := startPolicyAgent(t, env, "victim", dir, policy)
	state := filepath.Join(dir, ".state")
	keyFile := filepath.Join(identity.Open(state).Dir(), identity.KeyFile)
	seed := readSeed(t, keyFile)
	cs := env.Client("2025-11-25", nil)
	bash := func(command string, extra ...any) string {
		args := map[string]any{"host": "victim", "command": command}
		for i := 0; i+1 < len(extra); i += 2 {
			args[extra[i].(string)] = extra[i+1]
		}
		return text(call(t, cs, "bash", args))
	}
	if out := bash("cat notes.txt"); !strings.Contains(out, "workspace notes") {
		t.Fatalf("a confined command cannot read the workspace: %q", out)
	}
	rel := strings.TrimPrefix(keyFile, dir+"/")
	pid := agentProc.Pid
	attacks := []string{
		"cat " + keyFile,
		"cat " + filepath.Join(dir, "sub") + "/../" + rel,
		"cat sub/../" + rel,
		"cat /proc/self/cwd/" + rel,
		"ln -s " + state + " sub/st; cat sub/st/identity/" + identity.KeyFile,
		"ln -s " + keyFile + " sub/key; cat sub/key",
		fmt.Sprintf("cat /proc/%d/root%s", pid, keyFile),
		fmt.Sprintf("cat /proc/%d/cwd/%s", pid, rel),
		fmt.Sprintf("cat /proc/%d/fd/0 /proc/%d/fd/3 /proc/%d/fd/4 /proc/%d/fd/5 /proc/%d/fd/6 /proc/%d/fd/7", pid, pid, pid, pid, pid, pid),
		fmt.Sprintf("cat /proc/%d/environ /proc/%d/mem", pid, pid),
	}
	for _, a := range attacks {
		if out := bash(a); strings.Contains(out, seed) {
			t.Errorf("%s printed the host's key seed", a)
		} else if !strings.Contains(out, "Permission denied") {
			t.Errorf("%s did not fail as the kernel refuses it: %s", a, out)
		}
	}
	// A background task is confined too.
	r := call(t, cs, "bash", map[string]any{"host": "victim", "command": "cat " + keyFile, "background": true})
	id, _ := structured(t, r)["task_id"].(string)
	st := call(t, cs, "task_status", map[string]any{"host": "victim", "task_id": id, "wait": 20})
	if out := text(st); strings.Contains(out, seed) || !strings.Contains(out, "ermission denied") {
		t.Errorf("a background task: %s", out)
	}
	if got := readSeed(t, keyFile); got != seed {
		t.Fatal("the key file changed")
	}

	// The same attack against a host whose commands are not confined.
	open := t.TempDir()
	startPolicyAgent(t, env, "open", open, strings.ReplaceAll(policy, dir, open), "--confine_commands", "off")
	openKey := filepath.Join(identity.Open(filepath.Join(open, ".state")).Dir(), identity.KeyFile)
	if out := text(call(t, cs, "bash", map[string]any{"host": "open", "command": "cat " + openKey})); !strings.Contains(out, readSeed(t, openKey)) {
		t.Fatalf("unconfined, cat of the key did not print it: %q", out)
	}

	hosts := text(call(t, cs, "hosts", map[string]any{}))
	for _, want := range []string{"commands confined (landlock abi ", "commands NOT confined (off (--confine_commands off)"} {
		if !strings.Contains(hosts, want) {
			t.Errorf("hosts does not say %q:\n%s", want, hosts)
		}
	}
}

// readSeed returns the seed in a key file, without its newline.
func readSeed(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	seed := strings.TrimSpace(string(data))
	if !strings.HasPrefix(seed, "SU") {
		t.Fatalf("%s holds no user seed", path)
	}
	return seed
}
