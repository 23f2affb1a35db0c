//go:build linux

package install

import (
	"bytes"
	"context"
	"os"
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
		WorkDirs: []string{"/srv/work"}, DrainTimeout: 30 * time.Second,
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
		"EnvironmentFile=-/etc/fleetmcp/agent.env\n", "NoNewPrivileges=yes\n", "ProtectHome=read-only\n"} {
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
