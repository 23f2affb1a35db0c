package install

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The packaged unit with the packaged environment file gives the agent
// the flags the service runs with; a drop-in's ExecStart replaces the
// unit's; install's unit and environment file read back as written.
func TestReadServiceArgs(t *testing.T) {
	root := t.TempDir()
	write := func(path string, data []byte, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
	}
	pkgEnv, err := os.ReadFile("../../deploy/systemd/fleet-agent.env")
	if err != nil {
		t.Fatal(err)
	}
	write(UnitPaths[1], packagedUnit, 0o644)
	write("/etc/fleetmcp/agent.env", pkgEnv, 0o600)
	sa, err := ReadServiceArgs(root, UnitPaths[1])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"--state_dir", "/var/lib/fleetmcp-agent", "--policy", "/etc/fleetmcp/policy.yaml"}; !slices.Equal(sa.Args, want) {
		t.Errorf("the packaged service's args %q, want %q", sa.Args, want)
	}

	// install's unit and environment file.
	u := Unit{User: DefaultUser, Executable: "/usr/local/bin/fleet-agent", Args: []string{"--cwd", "/srv/my work", "--max_concurrent=4"}, DrainTimeout: 30 * time.Second}
	text, err := u.Render()
	if err != nil {
		t.Fatal(err)
	}
	env, err := EnvFile(map[string]string{"FLEET_POLICY": "/etc/p$1.yaml", "FLEET_NATS_URL": "tls://n1:4222,tls://n2:4222"})
	if err != nil {
		t.Fatal(err)
	}
	write(UnitPaths[0], text, 0o644)
	write("/etc/fleetmcp/agent.env", env, 0o600)
	sa, err = ReadServiceArgs(root, UnitPaths[0])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"--state_dir", "/var/lib/fleetmcp-agent", "--cwd", "/srv/my work", "--max_concurrent=4", "--nats", "tls://n1:4222,tls://n2:4222", "--policy", "/etc/p$1.yaml"}
	if !slices.Equal(sa.Args, want) {
		t.Errorf("install's service args %q, want %q", sa.Args, want)
	}

	// A drop-in that replaces ExecStart.
	write(dropInDir+"/10-flags.conf", []byte("[Service]\nExecStart=\nExecStart=/usr/bin/fleet-agent --state_dir /srv/state ${EXTRA}\nEnvironmentFile=-/etc/fleetmcp/none.env\n"), 0o644)
	sa, err = ReadServiceArgs(root, UnitPaths[0])
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"--state_dir", "/srv/state", ""}; !slices.Equal(sa.Args, want) || len(sa.DropIns) != 1 {
		t.Errorf("with a drop-in: %q (drop-ins %q), want %q", sa.Args, sa.DropIns, want)
	}
	if _, err := ReadServiceArgs(root, "/etc/systemd/system/none.service"); err == nil {
		t.Error("a missing unit was read")
	}
}

func TestSplitExecStart(t *testing.T) {
	env := map[string]string{"FLAGS": " --a 1\t--b  ", "ONE": "x y"}
	for line, want := range map[string][]string{
		"/bin/x $FLAGS":                  {"/bin/x", "--a", "1", "--b"},
		"-/bin/x ${ONE} 'a  b'":          {"/bin/x", "x y", "a  b"},
		`/bin/x "a b" c\ d 100%% $$HOME`: {"/bin/x", "a b", "c d", "100%", "$HOME"},
		"/bin/x $MISSING":                {"/bin/x"},
	} {
		got, err := SplitExecStart(line, env)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("SplitExecStart(%q) = %q, %v; want %q", line, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", `/bin/x "open`, "/bin/x %n", "/bin/x a$B"} {
		if got, err := SplitExecStart(bad, env); err == nil {
			t.Errorf("SplitExecStart(%q) = %q, accepted", bad, got)
		}
	}
}

// FuzzSplitExecStart: what systemdCommand writes splits back into its
// arguments; nothing panics.
func FuzzSplitExecStart(f *testing.F) {
	for _, s := range []string{"plain", "with space", `q"uote`, `back\slash`, "100%", "$VAR", "${X}", "'s'", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, arg string) {
		_, _ = SplitExecStart(arg, nil)
		args := []string{"/usr/bin/fleet-agent", arg, "--x"}
		line, err := systemdCommand(args)
		if err != nil {
			return
		}
		got, err := SplitExecStart(line, nil)
		if err != nil || strings.Join(got, "\x01") != strings.Join(args, "\x01") {
			t.Fatalf("%q splits into %q, %v", line, got, err)
		}
	})
}

// FuzzParseEnvFile: what EnvFile writes reads back; nothing panics.
func FuzzParseEnvFile(f *testing.F) {
	for _, s := range []string{"/etc/p.yaml", `/etc/p"1"$x.yaml`, "a\\b`c", "'q'"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, policy string) {
		_, _ = ParseEnvFile([]byte(policy))
		_, _ = ParseUnitService([]byte(policy))
		data, err := EnvFile(map[string]string{"FLEET_POLICY": policy})
		if err != nil {
			return
		}
		vars, err := ParseEnvFile(data)
		if err != nil || vars["FLEET_AGENT_FLAGS"] != "--policy "+policy {
			t.Fatalf("%q reads back as %q, %v", data, vars["FLEET_AGENT_FLAGS"], err)
		}
	})
}
