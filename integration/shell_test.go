package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBashCwdAndShell: hosts and the system prompt show each host's
// shell; bash takes a per-call cwd through the gateway; PowerShell
// parameters are refused on a bash host with the reason, and bad ones by
// the gateway before they travel.
func TestBashCwdAndShell(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}})
	cs := env.Client("", nil)
	hosts := mustOK(t, call(t, cs, "hosts", nil))
	if !strings.Contains(hosts, "\tshell bash") && !strings.Contains(hosts, "\tshell sh") {
		t.Errorf("hosts does not show the shell:\n%s", hosts)
	}
	if got := structured(t, call(t, cs, "hosts", nil))["hosts"].([]any)[0].(map[string]any)["shell"]; got != "bash" && got != "sh" {
		t.Errorf("structured shell = %v", got)
	}
	prompt := readResource(t, cs, "resource://system-prompt").Text
	if !strings.Contains(prompt, "`alpha`") || !strings.Contains(prompt, ", shell bash") && !strings.Contains(prompt, ", shell sh") ||
		!strings.Contains(prompt, "PowerShell for hosts whose shell is pwsh or powershell") {
		t.Errorf("the system prompt does not tell the host's shell and which language to write:\n%s", prompt)
	}

	sub := filepath.Join(env.AgentDir("alpha"), "sub")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	real, _ := filepath.EvalSymlinks(sub)
	if got := mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "pwd -P", "cwd": "sub"})); got != real+"\n" {
		t.Errorf("bash in cwd sub printed %q, want %s", got, real)
	}
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "pwd", "cwd": "missing"}), "missing")
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo", "parameters": map[string]any{"Name": "x"}}),
		"this host's shell is not PowerShell")
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo", "parameters": map[string]any{"bad name": "x"}}),
		`parameter name "bad name"`)
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo", "cwd": strings.Repeat("d", 5000)}), "cwd is longer than 4096 bytes")
}
