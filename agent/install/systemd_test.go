package install

import (
	"os"
	"strings"
	"testing"
	"time"
)

func unit() Unit {
	return Unit{User: "fleet-agent", Executable: "/usr/local/bin/fleet-agent", StateDir: "/var/lib/fleetmcp-agent",
		EnvFile: "/etc/fleetmcp/agent.env", Args: []string{"--cwd", "/srv/work"}, WorkDirs: []string{"/srv/work"}, DrainTimeout: 30 * time.Second}
}

// The unit runs the agent as its user with the identity in its state
// directory, hardened where that costs the agent nothing of its job.
func TestUnitRender(t *testing.T) {
	u := unit()
	text, err := u.Render()
	if err != nil {
		t.Fatal(err)
	}
	s := string(text)
	for _, want := range []string{
		"User=fleet-agent\n", "EnvironmentFile=-/etc/fleetmcp/agent.env\n", "StateDirectory=fleetmcp-agent\n", "StateDirectoryMode=0700\n",
		"ExecStart=/usr/local/bin/fleet-agent --state_dir /var/lib/fleetmcp-agent --cwd /srv/work $FLEET_AGENT_FLAGS\n",
		"KillMode=process\n", "TimeoutStopSec=45\n", "Restart=always\n", "RestartPreventExitStatus=77\n",
		"NoNewPrivileges=yes\n", "ProtectSystem=full\n", "ProtectHome=read-only\n", "ProtectKernelTunables=yes\n",
		"WantedBy=multi-user.target\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the unit lacks %q:\n%s", want, s)
		}
	}
	for _, never := range []string{"PrivateTmp=yes", "ProtectSystem=strict", "PrivateNetwork", "RestrictAddressFamilies", "KillMode=mixed"} {
		if strings.Contains(s, "\n"+never) {
			t.Errorf("the unit takes away what the agent is for: %q", never)
		}
	}

	// Working under /home keeps home directories writable.
	u.WorkDirs = []string{"/home/dev/project"}
	text, _ = u.Render()
	if strings.Contains(string(text), "ProtectHome=read-only") {
		t.Error("ProtectHome with a working directory under /home")
	}
	// Root administers the machine: no sandbox.
	u = unit()
	u.User = "root"
	text, _ = u.Render()
	if strings.Contains(string(text), "NoNewPrivileges") || strings.Contains(string(text), "ProtectSystem") || !strings.Contains(string(text), "User=root") {
		t.Errorf("a root unit is sandboxed:\n%s", text)
	}
	// A state directory systemd cannot manage is refused.
	u = unit()
	u.StateDir = "/opt/agent"
	if _, err := u.Render(); err == nil {
		t.Error("a state directory outside /var/lib was accepted")
	}
}

// unquote splits an ExecStart= line the way systemd does for what
// systemdCommand writes: words, double-quoted words with C escapes, "%%"
// and "$$" for "%" and "$".
func unquote(t testing.TB, line string) []string {
	var out []string
	for i := 0; i < len(line); {
		if line[i] == ' ' {
			i++
			continue
		}
		var w strings.Builder
		if line[i] == '"' {
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' {
					i++
					switch line[i] {
					case 't':
						w.WriteByte('\t')
					default:
						w.WriteByte(line[i])
					}
					continue
				}
				w.WriteByte(line[i])
			}
			if i == len(line) {
				t.Fatalf("unterminated quote in %q", line)
			}
			i++
		} else {
			for ; i < len(line) && line[i] != ' '; i++ {
				if line[i] == '"' || line[i] == '\\' || line[i] == '\'' || line[i] == ';' {
					t.Fatalf("unquoted special character in %q", line)
				}
				w.WriteByte(line[i])
			}
		}
		s := strings.ReplaceAll(strings.ReplaceAll(w.String(), "%%", "\x00"), "$$", "$")
		if strings.Contains(s, "%") || strings.Contains(strings.ReplaceAll(w.String(), "$$", ""), "$") {
			t.Fatalf("a lone %% or $ in %q", line)
		}
		out = append(out, strings.ReplaceAll(s, "\x00", "%"))
	}
	return out
}

func TestSystemdCommand(t *testing.T) {
	args := []string{"/usr/local/bin/fleet-agent", "--cwd", "/srv/my work", "--shell=/bin/bash", `--x="q"\`, "100%", "$HOME", "${X}", ";", "", "a\tb", "'s'"}
	line, err := systemdCommand(args)
	if err != nil {
		t.Fatal(err)
	}
	if got := unquote(t, line); strings.Join(got, "|") != strings.Join(args, "|") {
		t.Errorf("%s\nsplits into %q, want %q", line, got, args)
	}
	for _, bad := range [][]string{{"relative"}, {"-/bin/x"}, {"/bin/x", "a\nb"}, {"/bin/x", "a\x00"}} {
		if _, err := systemdCommand(bad); err == nil {
			t.Errorf("systemdCommand(%q) accepted", bad)
		}
	}
}

// FuzzSystemdCommand: whatever arguments it accepts, systemd splits the
// line back into them.
func FuzzSystemdCommand(f *testing.F) {
	for _, s := range []string{"plain", "with space", `q"uote`, `back\slash`, "100%", "$VAR", ";", "", "'"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, arg string) {
		args := []string{"/usr/local/bin/fleet-agent", arg, "--x"}
		line, err := systemdCommand(args)
		if err != nil {
			return
		}
		if got := unquote(t, line); strings.Join(got, "\x01") != strings.Join(args, "\x01") {
			t.Fatalf("%q splits into %q", line, got)
		}
	})
}

func TestEnvFile(t *testing.T) {
	text, err := EnvFile(map[string]string{"FLEET_POLICY": `/etc/fleetmcp/p"1"$x.yaml`, "FLEET_NATS_URL": "tls://n1:4222"})
	if err != nil {
		t.Fatal(err)
	}
	want := "\nFLEET_AGENT_FLAGS=\"--nats tls://n1:4222 --policy /etc/fleetmcp/p\\\"1\\\"\\$x.yaml\"\n"
	if !strings.HasSuffix(string(text), want) {
		t.Errorf("env file:\n%s\nwant it to end with\n%s", text, want)
	}
	// The package's file is the same format.
	pkg, err := os.ReadFile("../../deploy/systemd/fleet-agent.env")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(pkg), "\nFLEET_AGENT_FLAGS=") || !strings.Contains(string(pkg), "keep it 0600") {
		t.Errorf("the package's env file is not in the format install writes:\n%s", pkg)
	}
	if text, _ := EnvFile(nil); !strings.Contains(string(text), "#FLEET_AGENT_FLAGS=--policy ") {
		t.Errorf("an empty env file does not show how to set a policy:\n%s", text)
	}
	for _, bad := range []map[string]string{{"FLEET_POLICY": "a\nFLEET_NATS_URL=x"}, {"FLEET_POLICY": "/etc/my policy.yaml"}, {"lower": "x"}, {"": "x"}, {"FLEET_POLICY": ""}} {
		if _, err := EnvFile(bad); err == nil {
			t.Errorf("EnvFile(%q) accepted", bad)
		}
	}
}
