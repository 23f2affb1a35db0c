package integration

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent"
)

// policyHost starts agent name under the host policy text, in which CWD
// stands for its working directory, and returns that directory.
func policyHost(t *testing.T, env *Env, name, text string) string {
	t.Helper()
	cwd := t.TempDir()
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(text, "CWD", cwd)), 0o600); err != nil {
		t.Fatal(err)
	}
	env.StartAgent(name, func(c *agent.Config) {
		c.Cwd = cwd
		c.StateDir = filepath.Join(cwd, ".state")
		c.PolicyFile = file
	})
	env.WaitHost(name, true)
	return cwd
}

// TestHostPolicyTools: a tool the host policy refuses is refused on that
// host, whatever the caller asks, and left out of its tool list; hosts
// carries the policy's digest.
func TestHostPolicyTools(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"open"}})
	cwd := policyHost(t, env, "guarded", "tools: {deny: [write, edit, patch, delete, move]}\n")
	cs := env.Client("2025-11-25", nil)

	mustErr(t, call(t, cs, "write", map[string]any{"host": "guarded", "path": "x.txt", "content": "x"}), "denied by host policy: tool write is not served on this host")
	mustErr(t, call(t, cs, "edit", map[string]any{"host": "guarded", "path": "x.txt", "edits": []map[string]any{{"old_string": "a", "new_string": "b"}}}), "denied by host policy")
	if _, err := os.Stat(filepath.Join(cwd, "x.txt")); !os.IsNotExist(err) {
		t.Errorf("a refused write wrote: %v", err)
	}
	mustOK(t, call(t, cs, "write", map[string]any{"host": "open", "path": "x.txt", "content": "x"}))
	// The audit trail records the host's refusal as a refusal.
	denied := auditRecords(t, cs, map[string]any{"host": "guarded", "tool": "write", "decision": "denied"})
	if len(denied) != 1 || denied[0].Rule != "host policy" || !strings.Contains(denied[0].Reason, "tool write is not served") {
		t.Errorf("audit records of the refused write: %+v", denied)
	}

	h, _ := env.Gateway.Host("guarded")
	if !slices.Equal(h.Tools, []string{"bash", "list", "read", "search", "skill", "task_cancel", "task_list", "task_status"}) || !strings.HasPrefix(h.PolicyDigest, "sha256:") {
		t.Errorf("guarded host: tools %v, policy digest %q", h.Tools, h.PolicyDigest)
	}
	if open, _ := env.Gateway.Host("open"); open.PolicyDigest != "" || len(open.Tools) != 13 {
		t.Errorf("unrestricted host: tools %v, policy digest %q", open.Tools, open.PolicyDigest)
	}
	table := mustOK(t, call(t, cs, "hosts", nil))
	for _, want := range []string{"tools bash,list,read,search,skill,task_cancel,task_list,task_status\tpolicy " + h.PolicyDigest[:len("sha256:")+16],
		"tools bash,delete,edit,list,move,patch,read,search,skill,task_cancel,task_list,task_status,write\tpolicy unrestricted"} {
		if !strings.Contains(table, want) {
			t.Errorf("hosts table lacks %q:\n%s", want, table)
		}
	}
	for _, raw := range structured(t, call(t, cs, "hosts", nil))["hosts"].([]any) {
		host := raw.(map[string]any)
		if host["host"] == "guarded" && host["policy_digest"] != h.PolicyDigest {
			t.Errorf("hosts shows guarded with policy digest %v, want %s", host["policy_digest"], h.PolicyDigest)
		}
		if host["host"] == "open" && host["policy_digest"] != "unrestricted" {
			t.Errorf("hosts shows the unrestricted host with policy digest %v, want %q as in its table", host["policy_digest"], "unrestricted")
		}
	}
	// The resource says what the hosts tool says.
	var doc struct{ Hosts []hostFacts }
	readJSON(t, cs, "resource://hosts", &doc)
	for _, f := range doc.Hosts {
		if want := map[string]string{"guarded": h.PolicyDigest, "open": "unrestricted"}[f.Name]; f.PolicyDigest != want {
			t.Errorf("resource://hosts shows %s with policy digest %q, want %q", f.Name, f.PolicyDigest, want)
		}
	}
	// A skill hidden by the policy is checked in package policy
	// (AllowSkill): hosts have no skill catalog yet.
}

// TestHostPolicyPaths: path rules hold against symbolic links, "..",
// prefix siblings and /proc/self/root, through the real gateway.
func TestHostPolicyPaths(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	cwd := policyHost(t, env, "guarded", `paths: {allow: ["CWD/work/**"], deny: ["**/secret/**"]}`)
	outside := filepath.Join(t.TempDir(), "outside.txt")
	writeFile(t, outside, "outside\n")
	writeFile(t, filepath.Join(cwd, "work/ok.txt"), "ok\n")
	writeFile(t, filepath.Join(cwd, "work/secret/key.txt"), "key\n")
	writeFile(t, filepath.Join(cwd, "work_evil/x.txt"), "evil\n")
	for link, target := range map[string]string{"work/out": outside, "work/harmless": filepath.Join(cwd, "work/secret/key.txt")} {
		if err := os.Symlink(target, filepath.Join(cwd, link)); err != nil {
			t.Fatal(err)
		}
	}
	cs := env.Client("", nil)
	for _, p := range []string{"work/out", "work/../work_evil/x.txt", "work_evil/x.txt", "work/harmless", "work/secret/key.txt",
		"/proc/self/root" + filepath.Join(cwd, "work/secret/key.txt"), "/proc/self/root" + outside} {
		mustErr(t, call(t, cs, "read", map[string]any{"host": "guarded", "path": p}), "denied")
		mustErr(t, call(t, cs, "write", map[string]any{"host": "guarded", "path": p, "content": "x"}), "denied")
	}
	// The agent's state directory is its own, whatever the policy says.
	mustErr(t, call(t, cs, "write", map[string]any{"host": "guarded", "path": ".state/output/x.log", "content": "x"}), "belongs to the agent")
	if data, _ := os.ReadFile(outside); string(data) != "outside\n" {
		t.Errorf("outside file changed to %q", data)
	}
	if got := mustOK(t, call(t, cs, "read", map[string]any{"host": "guarded", "path": "work/ok.txt"})); got != "ok\n" {
		t.Errorf("read work/ok.txt = %q", got)
	}
	mustOK(t, call(t, cs, "write", map[string]any{"host": "guarded", "path": "work/new/file.txt", "content": "new"}))

	// The full output of a truncated command stays readable: the bash
	// tool points at it, whatever the allow lists say.
	out := mustOK(t, call(t, cs, "bash", map[string]any{"host": "guarded", "command": "seq 1 3000"}))
	_, spill, ok := strings.Cut(out, "Full output: ")
	if !ok {
		t.Fatalf("no full-output note in %q", out[len(out)-200:])
	}
	spill = strings.TrimSuffix(spill, "]")
	if got := mustOK(t, call(t, cs, "read", map[string]any{"host": "guarded", "path": spill, "limit": 1})); !strings.HasPrefix(got, "1\n") {
		t.Errorf("read of the full output = %q", got)
	}
}

// TestHostPolicyCommands: a refused command is refused wherever it hides
// in the line, and never runs.
func TestHostPolicyCommands(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	cwd := policyHost(t, env, "guarded", `
bash:
  allow: ["echo *", "ls *", "cat *", "true", "sudo *", "env *", "nice *", "nohup *", "timeout *", "command *",
          "exec *", "xargs *", "find *", "bash *", "sh *"]
  deny: ["cat *.key"]
`)
	marker := filepath.Join(cwd, "marker")
	touch := "touch " + marker
	lines := []string{
		touch, "/usr/bin/touch " + marker, "t\\ouch " + marker, "'touch' " + marker, `"tou"ch ` + marker,
		"ls; " + touch, "ls && " + touch, "false || " + touch, "ls | " + touch, "ls & " + touch, "ls\n" + touch,
		"(" + touch + ")", "{ " + touch + "; }", "if true; then " + touch + "; fi", "while true; do " + touch + "; break; done",
		"for i in 1; do " + touch + "; done", "case x in x) " + touch + ";; esac", "f() { " + touch + "; }; f",
		"echo $(" + touch + ")", "echo `" + touch + "`", "cat <(" + touch + ")", "echo \"$(" + touch + ")\"",
		"sudo " + touch, "env A=1 " + touch, "nice " + touch, "nohup " + touch, "timeout 5 " + touch,
		"command " + touch, "exec " + touch, "echo " + marker + " | xargs touch", "find . -maxdepth 0 -exec " + touch + " \\;",
		"bash -c '" + touch + "'", "sh -c \"ls; " + touch + "\"", "eval '" + touch + "'", "source /dev/null",
		"X=touch; $X " + marker,
	}
	for _, era := range eras {
		cs := env.Client(era.Version, nil)
		for _, line := range lines {
			mustErr(t, call(t, cs, "bash", map[string]any{"host": "guarded", "command": line}), "denied")
		}
		mustErr(t, call(t, cs, "bash", map[string]any{"host": "guarded", "command": "cat server.key"}), `bash.deny "cat *.key"`)
		if got := mustOK(t, call(t, cs, "bash", map[string]any{"host": "guarded", "command": "echo 'a; touch x' && ls -d ."})); got != "a; touch x\n.\n" {
			t.Errorf("allowed line = %q", got)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("a refused command ran: %v", err)
	}
}

// TestReadOnlyProfileOptionRunners: under the shipped read-only profile,
// sort --compress-program=sh with its commands in a here-document (sort
// pipes its temporary data, the commands, through the program) is
// refused in every spelling sort accepts, while plain sort works. The
// same line on an unrestricted host does run, so the payload is live.
func TestReadOnlyProfileOptionRunners(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"free"}})
	profile, err := os.ReadFile("../deploy/policies/read-only.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cwd := policyHost(t, env, "readonly", string(profile))
	writeFile(t, filepath.Join(cwd, "names.txt"), "b\na\n")
	payload := func(marker string) string {
		return strings.Repeat("touch "+marker+"\n", 2000)
	}
	marker := filepath.Join(cwd, "marker")
	writeFile(t, filepath.Join(cwd, "cmds.txt"), payload(marker))
	lines := []string{
		"sort --compress-program=sh -S 1 <<'EOF'\n" + payload(marker) + "EOF",
		"sort --compress-prog=sh -S 1 <<EOF\n" + payload(marker) + "EOF",
		"sort -S 1 --com=sh cmds.txt",
		"sort cmds.txt -S 1 --compress-program sh",
		"sort -S 1 --compress-program=/bin/sh < cmds.txt",
	}
	for _, era := range eras {
		cs := env.Client(era.Version, nil)
		for _, line := range lines {
			mustErr(t, call(t, cs, "bash", map[string]any{"host": "readonly", "command": line}), "denied by host policy")
		}
		if got := mustOK(t, call(t, cs, "bash", map[string]any{"host": "readonly", "command": "sort names.txt"})); got != "a\nb\n" {
			t.Errorf("sort names.txt = %q", got)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("a refused command ran: %v", err)
	}

	free := filepath.Join(t.TempDir(), "marker")
	cs := env.Client(eras[0].Version, nil)
	call(t, cs, "bash", map[string]any{"host": "free", "command": "sort --compress-program=sh -S 1 <<'EOF'\n" + payload(free) + "EOF"})
	if _, err := os.Stat(free); err != nil {
		t.Fatalf("the payload did not run on the unrestricted host, so the test proves nothing: %v", err)
	}
}
