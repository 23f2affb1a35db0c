//go:build unix

package agent

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestPowerShellReal runs the bash tool with pwsh where it is installed:
// named parameters arrive as values whatever they hold, output is merged
// and UTF-8, exit codes and timeouts come back as on bash, and a
// per-call cwd holds.
func TestPowerShellReal(t *testing.T) {
	pwsh := lookPwsh(t)
	g := tbPolicyIn(t, "# unrestricted\n", pwsh, "")
	mkdirs(t, filepath.Join(g.cwd, "sub"))
	evil := `'; Write-Output PWNED; '$(Write-Output PWNED)` + "`" + `"-Force`
	r := run(t, g.toolbox, "bash", map[string]any{
		"command":    "param([string]$Name, [int]$Count, [switch]$Force)\n\"[$Name] $Count $Force ✓\"",
		"parameters": map[string]any{"Name": evil, "Count": 3},
	})
	if got := resultText(t, r); got != "["+evil+"] 3 False ✓\n" || r.IsError {
		t.Errorf("parameters: %q (error %v)", got, r.IsError)
	}
	r = run(t, g.toolbox, "bash", map[string]any{"command": "Write-Output out; Write-Error err; exit 3"})
	if got := resultText(t, r); !r.IsError || !strings.Contains(got, "out") || !strings.Contains(got, "err") || !strings.HasSuffix(got, "Command exited with code 3") {
		t.Errorf("exit 3: %q (error %v)", got, r.IsError)
	}
	r = run(t, g.toolbox, "bash", map[string]any{"command": "(Get-Location).Path", "cwd": "sub"})
	if got := resultText(t, r); strings.TrimSpace(got) != filepath.Join(g.cwd, "sub") {
		t.Errorf("cwd: %q", got)
	}
	r = run(t, g.toolbox, "bash", map[string]any{"command": "Start-Sleep 30", "timeout": 1})
	if got := resultText(t, r); !r.IsError || !strings.HasSuffix(got, "Command timed out after 1 second") {
		t.Errorf("timeout: %q", got)
	}
	r = run(t, g.toolbox, "bash", map[string]any{"command": `'{"a": 1}'`})
	if string(r.Structured) != `{"a": 1}` {
		t.Errorf("JSON output: structured %s", r.Structured)
	}
}
