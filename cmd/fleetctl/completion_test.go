package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Each completion script is valid for its shell (checked where the shell
// is installed), and the bash one completes commands and flags.
func TestCompletionScripts(t *testing.T) {
	checks := map[string][]string{"bash": {"bash", "-n"}, "zsh": {"zsh", "-n"}, "fish": {"fish", "--no-execute"}}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		r := mustRun(t, nil, "completion", shell)
		for _, want := range []string{"token", "skills", "--wait", "--api_token_file", "audit"} {
			if shell == "fish" {
				want = strings.Replace(want, "--", "-l ", 1)
			}
			if !strings.Contains(r.stdout, want) {
				t.Errorf("the %s script does not know %s", shell, want)
			}
		}
		path := filepath.Join(t.TempDir(), "fleetctl."+shell)
		if err := os.WriteFile(path, []byte(r.stdout), 0o600); err != nil {
			t.Fatal(err)
		}
		check := checks[shell]
		if _, err := exec.LookPath(check[0]); err != nil {
			t.Logf("%s is not installed: its script is not checked", check[0])
			continue
		}
		if out, err := exec.Command(check[0], append(check[1:], path)...).CombinedOutput(); err != nil {
			t.Errorf("%s says the script is not valid: %v\n%s", shell, err, out)
		}
		if shell != "bash" {
			continue
		}
		for line, want := range map[string]string{
			"fleetctl to":                                      "token",
			"fleetctl token cr":                                "create",
			"fleetctl --gateway https://g:8443 sk":             "skills",
			"fleetctl skills rollout deploy --selector x --wa": "--wait",
			"fleetctl completion z":                            "zsh",
			"fleetctl audit --si":                              "--since",
		} {
			words := strings.Fields(line)
			script := `source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _fleetctl; echo "${COMPREPLY[*]}"`
			out, err := exec.Command("bash", append([]string{"-c", script, "bash", path}, words...)...).CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != want {
				t.Errorf("completing %q gave %q (%v); want %q", line, out, err, want)
			}
		}
	}
	for _, bad := range [][]string{{"completion"}, {"completion", "tcsh"}} {
		if r := fleetctl(t, nil, bad...); r.code != 2 {
			t.Errorf("fleetctl %s: exit %d", strings.Join(bad, " "), r.code)
		}
	}
}

// The own flags the scripts list for the commands outside the groups are
// the commands' flags.
func TestCompletionTopFlags(t *testing.T) {
	for name, flags := range topFlagNames {
		if name == "help" || name == "completion" {
			continue
		}
		r := fleetctl(t, nil, name, "-h")
		for _, f := range flags {
			if !strings.Contains(r.stderr, "--"+f) {
				t.Errorf("fleetctl %s -h does not list --%s:\n%s", name, f, r.stderr)
			}
		}
	}
}

// help names every command, and help COMMAND describes a command outside
// the groups as its -h does, without an error.
func TestHelpTopCommands(t *testing.T) {
	r := mustRun(t, nil, "help")
	for _, name := range append([]string{"doctor"}, topCommandNames...) {
		if !strings.Contains(r.stderr, "  "+name+" ") {
			t.Errorf("help does not list %s:\n%s", name, r.stderr)
		}
		h := mustRun(t, nil, "help", name)
		if !strings.Contains(h.stderr, "Usage: fleetctl "+name) {
			t.Errorf("help %s:\n%s", name, h.stderr)
		}
	}
}
