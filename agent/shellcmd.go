package agent

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf16"
)

// How a command line becomes a process. A POSIX shell gets it as
// "SHELL -c LINE". PowerShell (pwsh, or Windows PowerShell 5.1) never
// sees the caller's text on its command line: the agent writes the
// script and its named parameters to files in its state directory and
// starts PowerShell with a fixed bootstrap (psBootstrap) that reads them,
// builds a script block from the text and invokes it with the parameters
// splatted from a hashtable. A value is therefore always a value, never
// code, whatever characters it holds, and a script of any length runs
// without Windows' 32,767-character command-line limit.

// shellInvocation is how one command runs: the program and its
// arguments, and the variables added to its environment.
type shellInvocation struct {
	argv []string
	env  []string
}

// isPowerShell reports whether shell, a name or a path, is PowerShell:
// pwsh (PowerShell 6 and later) or powershell (Windows PowerShell).
func isPowerShell(shell string) bool {
	switch shellBase(shell) {
	case "pwsh", "powershell":
		return true
	}
	return false
}

// shellBase returns the program name of shell, a name or a path with
// either separator, in lower case and without ".exe".
func shellBase(shell string) string {
	base := strings.ToLower(filepath.Base(strings.ReplaceAll(shell, `\`, "/")))
	return strings.TrimSuffix(base, ".exe")
}

// posixInvocation runs line with a POSIX shell.
func posixInvocation(shell, line string) shellInvocation {
	return shellInvocation{argv: []string{shell, "-c", line}}
}

// Environment variables by which psBootstrap finds its script and its
// parameters. They are removed before the script runs.
const (
	psScriptVar = "FLEETMCP_PS_SCRIPT"
	psParamsVar = "FLEETMCP_PS_PARAMS"
)

// psBootstrap runs the script in the file $env:FLEETMCP_PS_SCRIPT with the
// named parameters in the JSON object in $env:FLEETMCP_PS_PARAMS (when
// set), writing UTF-8 without colours or progress bars. It works in
// Windows PowerShell 5.1 and in pwsh. The exit status: the script's exit
// N; otherwise 0 when its last statement succeeded, and when it failed
// the last program's exit code, or 1.
const psBootstrap = `$ErrorActionPreference = 'Continue'
$ProgressPreference = 'SilentlyContinue'
try { $fleetEnc = New-Object System.Text.UTF8Encoding $false; [Console]::OutputEncoding = $fleetEnc; $OutputEncoding = $fleetEnc } catch {}
if ($PSStyle) { $PSStyle.OutputRendering = 'PlainText' }
$fleetText = [System.IO.File]::ReadAllText($env:FLEETMCP_PS_SCRIPT, [System.Text.Encoding]::UTF8)
$fleetArgs = @{}
if ($env:FLEETMCP_PS_PARAMS) {
	$fleetJson = [System.IO.File]::ReadAllText($env:FLEETMCP_PS_PARAMS, [System.Text.Encoding]::UTF8) | ConvertFrom-Json
	foreach ($fleetP in $fleetJson.PSObject.Properties) { $fleetArgs[$fleetP.Name] = $fleetP.Value }
}
Remove-Item Env:FLEETMCP_PS_SCRIPT, Env:FLEETMCP_PS_PARAMS -ErrorAction SilentlyContinue
Remove-Variable fleetEnc, fleetJson, fleetP -ErrorAction SilentlyContinue
$global:LASTEXITCODE = 0
& ([scriptblock]::Create($fleetText)) @fleetArgs
if ($?) { exit 0 }
if ($LASTEXITCODE) { exit $LASTEXITCODE }
exit 1
`

// psArgs are PowerShell's options ahead of the encoded bootstrap: no
// profile (a user's profile could print, prompt or change anything), no
// prompts, and no execution policy in the way of a script block that is
// never a script file.
var psArgs = []string{"-NoProfile", "-NonInteractive", "-NoLogo", "-ExecutionPolicy", "Bypass", "-EncodedCommand"}

// encodePS encodes a script for -EncodedCommand: base64 of its UTF-16LE.
func encodePS(script string) string {
	units := utf16.Encode([]rune(script))
	b := make([]byte, 2*len(units))
	for i, u := range units {
		binary.LittleEndian.PutUint16(b[2*i:], u)
	}
	return base64.StdEncoding.EncodeToString(b)
}

// psInvocation runs the script in scriptFile with the parameters in
// paramsFile ("" for none) with the PowerShell at shell.
func psInvocation(shell, scriptFile, paramsFile string) shellInvocation {
	argv := append([]string{shell}, psArgs...)
	inv := shellInvocation{argv: append(argv, encodePS(psBootstrap)), env: []string{psScriptVar + "=" + scriptFile}}
	if paramsFile != "" {
		inv.env = append(inv.env, psParamsVar+"="+paramsFile)
	}
	return inv
}

// writePSFiles writes the script line (after a UTF-8 BOM, so that
// Windows PowerShell 5.1, which reads a file without one in the system's
// ANSI code page, reads it as UTF-8 too) and its parameters (none: no
// parameters file) as base+".ps1" and base+".json", readable by the
// agent's user only, and returns their paths.
func writePSFiles(base, line string, params map[string]json.RawMessage) (scriptFile, paramsFile string, err error) {
	if err := os.MkdirAll(filepath.Dir(base), 0o700); err != nil {
		return "", "", err
	}
	scriptFile = base + ".ps1"
	if err := os.WriteFile(scriptFile, []byte(utf8BOM+line), 0o600); err != nil {
		return "", "", err
	}
	if len(params) == 0 {
		return scriptFile, "", nil
	}
	data, err := json.Marshal(params)
	if err != nil {
		os.Remove(scriptFile)
		return "", "", fmt.Errorf("encode parameters: %w", err)
	}
	paramsFile = base + ".json"
	if err := os.WriteFile(paramsFile, data, 0o600); err != nil {
		os.Remove(scriptFile)
		return "", "", err
	}
	return scriptFile, paramsFile, nil
}

// invocation returns how the toolbox's shell runs line with params, for
// the call or task whose files start with base; cleanup removes what it
// wrote. Parameters are for PowerShell only.
func invocation(shell, base, line string, params map[string]json.RawMessage) (inv shellInvocation, cleanup func(), err error) {
	if !isPowerShell(shell) {
		if len(params) > 0 {
			return inv, nil, errParamsNeedPowerShell
		}
		return posixInvocation(shell, line), func() {}, nil
	}
	script, paramsFile, err := writePSFiles(base, line, params)
	if err != nil {
		return inv, nil, fmt.Errorf("write the script for %s: %w", shellBase(shell), err)
	}
	return psInvocation(shell, script, paramsFile), func() {
		os.Remove(script)
		if paramsFile != "" {
			os.Remove(paramsFile)
		}
	}, nil
}

var errParamsNeedPowerShell = errors.New("parameters are passed to PowerShell scripts, and this host's shell is not PowerShell; put the values in the command itself")

// describeShell returns what hosts shows as a host's shell: "pwsh 7.4.6"
// or "powershell 5.1.19041.4291" with the version PowerShell reports,
// else the program's name ("bash").
func describeShell(ctx context.Context, shell string) string {
	name := shellBase(shell)
	if !isPowerShell(shell) {
		return name
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, shell, "-NoProfile", "-NonInteractive", "-NoLogo", "-Command", "$PSVersionTable.PSVersion.ToString()")
	cmd.WaitDelay = time.Second
	out, err := cmd.Output()
	if v := strings.TrimSpace(string(out)); err == nil && v != "" && len(v) < 64 && !strings.ContainsAny(v, " \t\r\n") {
		return name + " " + v
	}
	return name
}
