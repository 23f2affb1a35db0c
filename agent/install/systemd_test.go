package install

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"
)

func unit() Unit {
	return Unit{User: DefaultUser, Executable: "/usr/local/bin/fleet-agent", Args: []string{"--cwd", "/srv/work"}, DrainTimeout: 30 * time.Second}
}

// The unit install embeds is the package's, byte for byte: one
// definition of the service, whichever way it is installed.
func TestPackagedUnitIsTheDeployOne(t *testing.T) {
	deployed, err := os.ReadFile("../../deploy/systemd/fleet-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(deployed, packagedUnit) {
		t.Fatal("agent/install/fleet-agent.service differs from deploy/systemd/fleet-agent.service: " +
			"the unit fleet-agent install writes is made from it, so change both (cp deploy/systemd/fleet-agent.service agent/install/)")
	}
}

// The unit install writes is the packaged unit: the same sandbox, state
// and home directories, working directory and environment file; only its
// header, User, ExecStart and TimeoutStopSec differ.
func TestUnitRender(t *testing.T) {
	u := unit()
	text, err := u.Render()
	if err != nil {
		t.Fatal(err)
	}
	s := string(text)
	for _, want := range []string{
		"User=fleetmcp-agent\n", "Group=fleetmcp-agent\n", "EnvironmentFile=/etc/fleetmcp/agent.env\n",
		"StateDirectory=fleetmcp-agent fleetmcp-agent-home\n", "StateDirectoryMode=0700\n",
		"WorkingDirectory=/var/lib/fleetmcp-agent-home\n", "Environment=HOME=/var/lib/fleetmcp-agent-home\n",
		"ExecStart=/usr/local/bin/fleet-agent --state_dir /var/lib/fleetmcp-agent --cwd /srv/work $FLEET_AGENT_FLAGS\n",
		"KillMode=process\n", "TimeoutStopSec=45\n", "Restart=always\n", "RestartPreventExitStatus=77\n", "WantedBy=multi-user.target\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("the unit lacks %q:\n%s", want, s)
		}
	}
	if !strings.HasPrefix(s, installHeader) {
		t.Errorf("the unit does not start with install's header:\n%s", s)
	}
	// Every line of the package's unit but the header and the four
	// settings is there, in its order.
	differ := map[string]bool{}
	pkgLines := strings.Split(string(bytes.TrimPrefix(packagedUnit, packagedHeader(packagedUnit))), "\n")
	var kept []string
	for _, l := range pkgLines {
		switch {
		case strings.HasPrefix(l, "ExecStart="), strings.HasPrefix(l, "User="), strings.HasPrefix(l, "TimeoutStopSec="):
			differ[l] = true
		default:
			kept = append(kept, l)
		}
	}
	var got []string
	for _, l := range strings.Split(strings.TrimPrefix(s, string(s[:strings.Index(s, "\n[Unit]\n")+1])), "\n") {
		if !strings.HasPrefix(l, "ExecStart=") && !strings.HasPrefix(l, "User=") && !strings.HasPrefix(l, "TimeoutStopSec=") {
			got = append(got, l)
		}
	}
	if strings.Join(got, "\n") != strings.Join(kept, "\n") {
		t.Errorf("the unit's other lines differ from the package's:\n%s\n---\n%s", strings.Join(got, "\n"), strings.Join(kept, "\n"))
	}
	if len(differ) != 3 {
		t.Errorf("the package's unit has %d of User=, ExecStart=, TimeoutStopSec=", len(differ))
	}

	// Another user: no group of the package's; a longer drain, a longer
	// stop.
	u.User, u.DrainTimeout = "root", time.Minute
	text, _ = u.Render()
	if s := string(text); strings.Contains(s, "\nGroup=") || !strings.Contains(s, "\nUser=root\n") || !strings.Contains(s, "\nTimeoutStopSec=75\n") {
		t.Errorf("a root unit:\n%s", s)
	}
	// A packaged unit of another shape is refused, not half rewritten.
	saved := packagedUnit
	t.Cleanup(func() { packagedUnit = saved })
	packagedUnit = bytes.Replace(saved, []byte("TimeoutStopSec=45\n"), nil, 1)
	if _, err := u.Render(); err == nil || !strings.Contains(err.Error(), "TimeoutStopSec=45") {
		t.Errorf("a packaged unit without TimeoutStopSec: %v", err)
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
