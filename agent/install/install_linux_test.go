//go:build linux

package install

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/agent/identity/identitytest"
)

// testOptions installs a fake binary into a new prefix, enrolling with g.
func testOptions(t *testing.T, g *identitytest.Gateway) Options {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fleet-agent")
	if err := os.WriteFile(bin, []byte("fleet-agent v1"), 0o700); err != nil {
		t.Fatal(err)
	}
	return Options{
		Join:   identity.JoinOptions{GatewayURL: g.URL, Token: g.Token, CAPin: g.Pin, Host: "web-1"},
		Prefix: t.TempDir(), User: DefaultUser, NoStart: true, Executable: bin,
		Args: []string{"--cwd", "/srv/work", "--max_concurrent=4"}, Env: map[string]string{"FLEET_POLICY": "/etc/fleetmcp/policy.yaml"},
		DrainTimeout: 30 * time.Second,
		Command: func(_ context.Context, name string, args ...string) error {
			t.Errorf("install ran %s %q under a prefix", name, args)
			return nil
		},
	}
}

type fileState struct {
	mode    os.FileMode
	modTime time.Time
	data    string
}

// snapshot records every file and directory under root.
func snapshot(t *testing.T, root string) map[string]fileState {
	t.Helper()
	out := map[string]fileState{}
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st := fileState{mode: fi.Mode(), modTime: fi.ModTime()}
		if fi.Mode().IsRegular() {
			data, _ := os.ReadFile(p)
			st.data = string(data)
		}
		out[rel] = st
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// An install into a prefix writes the binary, the state directory with
// the identity, the environment file and the unit, with the modes they
// need; a second install changes nothing and sends no request.
func TestInstallIntoPrefix(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	o := testOptions(t, g)
	var out bytes.Buffer
	o.Out = &out
	if err := Install(context.Background(), o); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	root := o.Prefix
	for path, mode := range map[string]os.FileMode{
		LinuxBinary: 0o755, LinuxStateDir: 0o700 | os.ModeDir, LinuxEnvFile: 0o600, LinuxUnit: 0o644,
		LinuxStateDir + "/identity": 0o700 | os.ModeDir, LinuxStateDir + "/identity/agent.nk": 0o600,
		LinuxStateDir + "/identity/agent.jwt": 0o600, LinuxStateDir + "/identity/enrolment.json": 0o600,
	} {
		fi, err := os.Stat(filepath.Join(root, path))
		if err != nil || fi.Mode() != mode {
			t.Errorf("%s: %v, mode %v; want %v", path, err, fi.Mode(), mode)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(root, LinuxBinary)); string(data) != "fleet-agent v1" {
		t.Errorf("the binary holds %q", data)
	}
	id, err := identity.Load(filepath.Join(root, LinuxStateDir))
	if err != nil || id.Enrolment.Host != "web-1" || id.Enrolment.GatewayURL != g.URL {
		t.Fatalf("the installed identity: %v", err)
	}
	unitText, _ := os.ReadFile(filepath.Join(root, LinuxUnit))
	for _, want := range []string{"User=fleetmcp-agent\n", "ExecStart=/usr/local/bin/fleet-agent --state_dir /var/lib/fleetmcp-agent --cwd /srv/work --max_concurrent=4 $FLEET_AGENT_FLAGS\n",
		"EnvironmentFile=/etc/fleetmcp/agent.env\n", "WorkingDirectory=/var/lib/fleetmcp-agent-home\n", "ProtectKernelModules=yes\n"} {
		if !strings.Contains(string(unitText), want) {
			t.Errorf("the unit lacks %q:\n%s", want, unitText)
		}
	}
	if strings.Contains(string(unitText), root) {
		t.Errorf("the unit names paths under the prefix:\n%s", unitText)
	}
	if env, _ := os.ReadFile(filepath.Join(root, LinuxEnvFile)); !strings.Contains(string(env), "\nFLEET_AGENT_FLAGS=\"--policy /etc/fleetmcp/policy.yaml\"\n") {
		t.Errorf("the env file:\n%s", env)
	}
	for _, want := range []string{"not creating fleetmcp-agent", "enrolled as \"web-1\"", "not started (--no_start)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report does not say %q:\n%s", want, out.String())
		}
	}

	// Again: nothing changes, no request is sent, the report says so.
	before, requests := snapshot(t, root), g.Requests()
	out.Reset()
	if err := Install(context.Background(), o); err != nil {
		t.Fatalf("second install: %v\n%s", err, out.String())
	}
	after := snapshot(t, root)
	for p, st := range before {
		if after[p] != st {
			t.Errorf("the second install changed %s: %+v -> %+v", p, st, after[p])
		}
	}
	if len(after) != len(before) || g.Requests() != requests {
		t.Errorf("the second install added files (%d -> %d) or sent requests (%d -> %d)", len(before), len(after), requests, g.Requests())
	}
	if strings.Contains(out.String(), "written") || !strings.Contains(out.String(), "enrolled already") {
		t.Errorf("the second install's report:\n%s", out.String())
	}

	// A new binary is installed, the rest is kept.
	if err := os.WriteFile(o.Executable, []byte("fleet-agent v2"), 0o700); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := Install(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(root, LinuxBinary)); string(data) != "fleet-agent v2" || strings.Count(out.String(), "written") != 1 {
		t.Errorf("the binary holds %q after an upgrade; report:\n%s", data, out.String())
	}
}

// A join that fails stops the install before the binary, the unit or
// the environment file are written.
func TestInstallStopsWhenTheJoinFails(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	for name, edit := range map[string]func(*Options){
		"wrong pin":     func(o *Options) { o.Join.CAPin = identitytest.NewCA(t, "other").Pin() },
		"unknown token": func(o *Options) { o.Join.Token = strings.Replace(g.Token, g.Token[len(g.Token)-4:], "AAAA", 1) },
		"http":          func(o *Options) { o.Join.GatewayURL = strings.Replace(g.URL, "https", "http", 1) },
		"bad user":      func(o *Options) { o.User = "-rf" },
		"relative":      func(o *Options) { o.Prefix = "relative/root" },
	} {
		o := testOptions(t, g)
		edit(&o)
		if err := Install(context.Background(), o); err == nil {
			t.Errorf("%s: the install succeeded", name)
			continue
		}
		for _, p := range []string{LinuxBinary, LinuxUnit, LinuxEnvFile} {
			if _, err := os.Stat(filepath.Join(o.Prefix, p)); err == nil {
				t.Errorf("%s: %s written by a failed install", name, p)
			}
		}
	}
}

// On the machine itself the service is enabled and started; one whose
// files changed is reloaded and restarted; --no_start leaves systemd
// alone.
func TestInstallSystemctl(t *testing.T) {
	var ran [][]string
	o := &Options{Prefix: "/", Out: &bytes.Buffer{}, Command: func(_ context.Context, name string, args ...string) error {
		ran = append(ran, append([]string{name}, args...))
		return nil
	}}
	for _, tc := range []struct {
		changed, noStart bool
		want             [][]string
	}{
		{false, false, [][]string{{"systemctl", "enable", "--now", "fleet-agent"}}},
		{true, false, [][]string{{"systemctl", "daemon-reload"}, {"systemctl", "enable", "fleet-agent"}, {"systemctl", "restart", "fleet-agent"}}},
		{true, true, nil},
	} {
		ran = nil
		o.NoStart = tc.noStart
		if err := o.systemctl(context.Background(), tc.changed); err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(ran, tc.want, slices.Equal) {
			t.Errorf("changed %v, no_start %v: ran %q, want %q", tc.changed, tc.noStart, ran, tc.want)
		}
	}
}

// asMachine makes o install into its prefix as if it were the machine's
// root, with systemd running there, as root, with the agent's user
// existing (the running user under its name) unless noUser, and cmd as
// the system commands.
func asMachine(t *testing.T, o *Options, cmd func(name string, args ...string) error) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(o.Prefix, systemdBooted), 0o755); err != nil {
		t.Fatal(err)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	o.machine = &machine{asRoot: true, euid: func() int { return 0 },
		lookupUser: func(name string) (*user.User, error) {
			if name != DefaultUser {
				return nil, user.UnknownUserError(name)
			}
			u := *me
			u.Username = name
			return &u, nil
		},
		lookPath: func(name string) (string, error) { return "/usr/bin/" + name, nil }}
	o.Command = func(_ context.Context, name string, args ...string) error { return cmd(name, args...) }
}

// An install that cannot finish stops before it spends the token: no
// request reaches the gateway, nothing under the root changes, and the
// error says what and what else to do.
func TestInstallChecksBeforeEnrolment(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	for name, tc := range map[string]struct {
		edit func(t *testing.T, o *Options)
		want string
	}{
		"not root": {func(_ *testing.T, o *Options) { o.machine.euid = func() int { return 1000 } }, "run it as root"},
		"no systemd": {func(t *testing.T, o *Options) {
			if err := os.Remove(filepath.Join(o.Prefix, systemdBooted)); err != nil {
				t.Fatal(err)
			}
		}, "systemd does not run this machine"},
		"no systemctl": {func(_ *testing.T, o *Options) {
			o.machine.lookPath = func(name string) (string, error) { return "", exec.ErrNotFound }
		}, "systemctl"},
		"no user, no useradd": {func(_ *testing.T, o *Options) {
			o.User = "fleet-other"
			o.machine.lookPath = func(name string) (string, error) {
				if name == "useradd" {
					return "", exec.ErrNotFound
				}
				return "/usr/bin/" + name, nil
			}
		}, "cannot be made"},
		"unit path a directory": {func(t *testing.T, o *Options) {
			if err := os.MkdirAll(filepath.Join(o.Prefix, LinuxUnit), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "is not a regular file"},
		"state dir a file": {func(t *testing.T, o *Options) {
			if err := os.MkdirAll(filepath.Join(o.Prefix, "/var/lib"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(o.Prefix, LinuxStateDir), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "is not a directory"},
	} {
		t.Run(name, func(t *testing.T) {
			o := testOptions(t, g)
			o.NoStart = false
			asMachine(t, &o, func(name string, args ...string) error {
				t.Errorf("ran %s %q before the checks passed", name, args)
				return nil
			})
			tc.edit(t, &o)
			before, requests := snapshot(t, o.Prefix), g.Requests()
			err := Install(context.Background(), o)
			var pe *PreflightError
			if !errors.As(err, &pe) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--no_start") ||
				!strings.Contains(err.Error(), "fleet-agent join") || !strings.Contains(err.Error(), "the join token was not used") {
				t.Fatalf("install: %v; want a check naming %q, --no_start and join", err, tc.want)
			}
			if g.Requests() != requests {
				t.Error("the install sent a request to the gateway")
			}
			after := snapshot(t, o.Prefix)
			if len(after) != len(before) {
				t.Errorf("the failed install changed the files: %d -> %d", len(before), len(after))
			}
			for p, st := range before {
				if after[p] != st {
					t.Errorf("the failed install changed %s", p)
				}
			}
		})
	}
}

// A service manager that fails after the enrolment: the error says the
// machine is enrolled and to run install again, which finishes without
// spending the token again.
func TestInstallServiceFailsAfterEnrolment(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	o := testOptions(t, g)
	o.NoStart = false
	var ran []string
	failing := true
	asMachine(t, &o, func(name string, args ...string) error {
		ran = append(ran, name+" "+strings.Join(args, " "))
		if failing && slices.Contains(args, "restart") {
			return errors.New("exit status 1")
		}
		return nil
	})
	err := Install(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "The machine is enrolled") || !strings.Contains(err.Error(), "run the same install again") {
		t.Fatalf("install with a failing systemctl: %v", err)
	}
	if _, err := identity.Load(filepath.Join(o.Prefix, LinuxStateDir)); err != nil {
		t.Fatalf("the identity after a failed start: %v", err)
	}
	requests := g.Requests()
	failing, ran = false, nil
	if err := Install(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if g.Requests() != requests {
		t.Error("install run again sent a request: the token would be spent twice")
	}
	if want := []string{"systemctl enable --now fleet-agent"}; !slices.Equal(ran, want) {
		t.Errorf("install run again ran %q, want %q", ran, want)
	}
}

// Beside the fleet-agent package, install enrols the machine and starts
// the packaged unit: it writes no binary, unit or environment file of its
// own, leaves the package's as they are, and removes an earlier install's
// unit and binary, which would shadow the package's.
func TestInstallBesidePackage(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	o := testOptions(t, g)
	o.NoStart, o.Args, o.Env = false, nil, map[string]string{}
	var ran []string
	asMachine(t, &o, func(name string, args ...string) error {
		ran = append(ran, name+" "+strings.Join(args, " "))
		return nil
	})
	write := func(path, data string, mode os.FileMode) {
		t.Helper()
		p := filepath.Join(o.Prefix, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), mode); err != nil {
			t.Fatal(err)
		}
	}
	write(PackagedBinary, "packaged fleet-agent", 0o755)
	write(PackagedUnit, string(packagedUnit), 0o644)
	write(LinuxEnvFile, "FLEET_AGENT_FLAGS=--policy /etc/fleetmcp/policy.yaml # edited\n", 0o600)
	// An earlier install, before the package.
	write(LinuxBinary, "older fleet-agent", 0o755)
	write(LinuxUnit, installHeader+" (an older one)\n[Unit]\n", 0o644)
	keep := []string{PackagedBinary, PackagedUnit, LinuxEnvFile}
	before := snapshot(t, o.Prefix)

	// Settings install would have to write into the package's
	// environment file: refused before the token is spent.
	bad := o
	bad.Env = map[string]string{"FLEET_POLICY": "/etc/p.yaml"}
	if err := Install(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "FLEET_AGENT_FLAGS there") || g.Requests() != 0 {
		t.Fatalf("install with --policy beside the package: %v (%d requests)", err, g.Requests())
	}

	var out bytes.Buffer
	o.Out = &out
	if err := Install(context.Background(), o); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	after := snapshot(t, o.Prefix)
	for _, p := range keep {
		p = strings.TrimPrefix(p, "/")
		if _, ok := before[p]; !ok || after[p] != before[p] {
			t.Errorf("install changed the package's %s", p)
		}
	}
	for _, p := range []string{LinuxBinary, LinuxUnit} {
		if _, ok := after[strings.TrimPrefix(p, "/")]; ok {
			t.Errorf("%s of the earlier install is still there, shadowing the package's", p)
		}
	}
	if _, err := identity.Load(filepath.Join(o.Prefix, LinuxStateDir)); err != nil {
		t.Fatalf("not enrolled: %v", err)
	}
	want := []string{"systemctl daemon-reload", "systemctl enable fleet-agent", "systemctl restart fleet-agent"}
	if !slices.Equal(ran, want) {
		t.Errorf("ran %q, want %q", ran, want)
	}
	if !strings.Contains(out.String(), "package: fleet-agent is installed") {
		t.Errorf("the report:\n%s", out.String())
	}
	// A unit install did not write shadows the package's: refused.
	write(LinuxUnit, "[Unit]\n", 0o644)
	if err := Install(context.Background(), o); err == nil || !strings.Contains(err.Error(), "install did not write it") {
		t.Errorf("install beside a foreign unit in /etc: %v", err)
	}
}
