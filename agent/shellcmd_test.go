package agent

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
)

func TestIsPowerShell(t *testing.T) {
	for shell, want := range map[string]bool{
		"pwsh": true, "/usr/bin/pwsh": true, `C:\Program Files\PowerShell\7\pwsh.exe`: true, "PWSH.EXE": true,
		`C:\Windows\System32\WindowsPowerShell\v1.0\powershell.exe`: true, "powershell": true,
		"bash": false, "/bin/sh": false, `C:\Program Files\Git\bin\bash.exe`: false, "pwsh-preview": false, "cmd.exe": false,
	} {
		if got := isPowerShell(shell); got != want {
			t.Errorf("isPowerShell(%q) = %v, want %v", shell, got, want)
		}
	}
}

// decodePS is what PowerShell does with -EncodedCommand.
func decodePS(t *testing.T, s string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil || len(b)%2 != 0 {
		t.Fatalf("not base64 UTF-16: %v", err)
	}
	units := make([]uint16, len(b)/2)
	for i := range units {
		units[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return string(utf16.Decode(units))
}

// TestPSInvocation: PowerShell runs a fixed bootstrap, never the caller's
// text, with no profile, no prompts, and the script and parameters
// named by environment variables.
func TestPSInvocation(t *testing.T) {
	for _, s := range []string{"", "ascii", "ünïcödé ✓ 𝄞 (outside the BMP)", psBootstrap} {
		if got := decodePS(t, encodePS(s)); got != s {
			t.Errorf("encodePS round trip: %q, want %q", got, s)
		}
	}
	inv := psInvocation(`C:\pwsh.exe`, `C:\state\run\c1.ps1`, `C:\state\run\c1.json`)
	want := []string{`C:\pwsh.exe`, "-NoProfile", "-NonInteractive", "-NoLogo", "-ExecutionPolicy", "Bypass", "-EncodedCommand"}
	if !slices.Equal(inv.argv[:len(want)], want) || len(inv.argv) != len(want)+1 {
		t.Fatalf("argv %q, want %q and the encoded bootstrap", inv.argv, want)
	}
	if got := decodePS(t, inv.argv[len(want)]); got != psBootstrap {
		t.Errorf("the encoded command is not the bootstrap: %q", got)
	}
	if !slices.Equal(inv.env, []string{psScriptVar + `=C:\state\run\c1.ps1`, psParamsVar + `=C:\state\run\c1.json`}) {
		t.Errorf("env %q", inv.env)
	}
	if inv := psInvocation("pwsh", "/s.ps1", ""); len(inv.env) != 1 {
		t.Errorf("without parameters: env %q, want only the script", inv.env)
	}
	// The bootstrap reads what the variables name and removes them.
	for _, s := range []string{"$env:" + psScriptVar, "$env:" + psParamsVar, "Remove-Item Env:" + psScriptVar, "@fleetArgs", "[scriptblock]::Create"} {
		if !strings.Contains(psBootstrap, s) {
			t.Errorf("the bootstrap lacks %q", s)
		}
	}
}

// TestPSFiles: the script and its parameters go to files, as they are:
// no quoting, no concatenation into a command line.
func TestPSFiles(t *testing.T) {
	dir := t.TempDir()
	line := "param($Name, [int]$Count)\n\"$Name x $Count\" # ünïcödé\r\n"
	params := map[string]json.RawMessage{
		"Name":  json.RawMessage(`"'; Remove-Item -Recurse C:\\ ; '$(evil)` + "`" + `\"-Force"`),
		"Count": json.RawMessage(`3`),
		"List":  json.RawMessage(`["a", 1, true, null]`),
	}
	inv, cleanup, err := invocation("/usr/bin/pwsh", filepath.Join(dir, "run", "call-1"), line, params)
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile(filepath.Join(dir, "run", "call-1.ps1"))
	if err != nil || string(script) != utf8BOM+line {
		t.Errorf("script file %q (%v), want the BOM and the line as it is", script, err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "run", "call-1.json"))
	var back map[string]json.RawMessage
	if err != nil || json.Unmarshal(data, &back) != nil || len(back) != 3 || string(back["Name"]) != string(params["Name"]) {
		t.Errorf("parameters file %s (%v)", data, err)
	}
	for _, a := range inv.argv {
		if strings.Contains(a, "evil") || strings.Contains(a, "param(") {
			t.Errorf("argument %q carries the caller's text", a)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "run", "call-1.json")); err == nil && fi.Mode().Perm() != 0o600 {
		t.Errorf("parameters file mode %v, want 0600", fi.Mode().Perm())
	}
	cleanup()
	if names, _ := os.ReadDir(filepath.Join(dir, "run")); len(names) != 0 {
		t.Errorf("cleanup left %v", names)
	}
	// A POSIX shell takes the line with -c and refuses parameters.
	inv, _, err = invocation("/bin/bash", filepath.Join(dir, "x"), "echo hi", nil)
	if err != nil || !slices.Equal(inv.argv, []string{"/bin/bash", "-c", "echo hi"}) || inv.env != nil {
		t.Errorf("bash invocation %+v, %v", inv, err)
	}
	if _, _, err := invocation("/bin/bash", filepath.Join(dir, "x"), "echo hi", params); err != errParamsNeedPowerShell {
		t.Errorf("bash with parameters: %v", err)
	}
}

func TestDescribeShell(t *testing.T) {
	ctx := context.Background()
	for shell, want := range map[string]string{"/bin/bash": "bash", "/bin/sh": "sh", `C:\Program Files\Git\bin\bash.exe`: "bash"} {
		if got := describeShell(ctx, shell); got != want {
			t.Errorf("describeShell(%q) = %q, want %q", shell, got, want)
		}
	}
	pwsh := lookPwsh(t)
	if got := describeShell(ctx, pwsh); !strings.HasPrefix(got, "pwsh ") || len(got) < len("pwsh 7") {
		t.Errorf("describeShell(%q) = %q, want pwsh and its version", pwsh, got)
	}
}

// lookPwsh returns the pwsh on PATH, or skips the test.
func lookPwsh(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("pwsh")
	if err != nil {
		t.Skip("pwsh is not installed: the PowerShell path is checked only as argument building here")
	}
	return p
}

func TestDefaultWindowsShell(t *testing.T) {
	found := func(names ...string) func(string) (string, error) {
		return func(n string) (string, error) {
			if slices.Contains(names, n) {
				return `C:\bin\` + n + ".exe", nil
			}
			return "", exec.ErrNotFound
		}
	}
	for _, tt := range []struct {
		look       func(string) (string, error)
		root, want string
	}{
		{found("pwsh", "powershell"), `C:\Windows`, `C:\bin\pwsh.exe`},
		{found("powershell"), `C:\Windows`, `C:\bin\powershell.exe`},
		{found(), `D:\WINNT`, filepath.Join(`D:\WINNT`, "System32", "WindowsPowerShell", "v1.0", "powershell.exe")},
		{found(), "", filepath.Join(`C:\Windows`, "System32", "WindowsPowerShell", "v1.0", "powershell.exe")},
	} {
		if got := defaultWindowsShell(tt.look, tt.root); got != tt.want {
			t.Errorf("defaultWindowsShell = %q, want %q", got, tt.want)
		}
	}
}
