package main

import (
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/cmd/internal/profile"
)

// fleetctl login checks the gateway, then saves the profile (0600) that
// later commands use with no flags; flags win over FLEET_* variables,
// which win over the profile, whose pin and token serve its own gateway
// only.
func TestLoginProfileAndPrecedence(t *testing.T) {
	g := startFakeGateway(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "cfg", "fleetctl.json")
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{profile.EnvPath: path}

	// A wrong pin: nothing is saved.
	bad := fleetctl(t, env, "login", "--gateway", g.url(), "--ca_pin", "sha256:"+strings.Repeat("0", 64), "--api_token_file", tokenFile)
	if bad.code == 0 || !strings.Contains(bad.stderr, "nothing saved") {
		t.Fatalf("login with a wrong pin: exit %d\n%s", bad.code, bad.stderr)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("a failed login saved a profile")
	}

	r := mustRun(t, env, "login", "--gateway", g.url(), "--ca_pin", g.ca.pin, "--token_file", tokenFile)
	contains(t, "login", r.stdout, "Saved the profile for "+g.url(), path)
	p, err := profile.Load(path)
	if err != nil || p.Gateway != g.url() || p.CAPin != g.ca.pin || p.APIToken != adminToken {
		t.Fatalf("profile %+v, %v", p, err)
	}

	// The profile alone reaches the gateway.
	before := len(g.sent())
	mustRun(t, env, "token", "list")
	if got := g.sent()[before:]; len(got) != 1 || got[0].Auth != "Bearer "+adminToken {
		t.Fatalf("with the profile, fleetctl sent %+v", got)
	}

	// The environment's token wins over the profile's; a flag wins over
	// the environment's.
	envTok := map[string]string{profile.EnvPath: path, "FLEET_API_TOKEN": userToken}
	if r := fleetctl(t, envTok, "token", "list"); r.code == 0 || !strings.Contains(r.stderr, "not one") {
		t.Errorf("FLEET_API_TOKEN did not win over the profile: exit %d\n%s", r.code, r.stderr)
	}
	mustRun(t, envTok, "token", "list", "--api_token", adminToken)

	// Another gateway named by the environment gets neither the
	// profile's pin nor its token.
	other := startFakeGateway(t)
	envGW := map[string]string{profile.EnvPath: path, "FLEET_GATEWAY": other.url(), "FLEET_CA_PIN": other.ca.pin}
	r = fleetctl(t, envGW, "token", "list")
	if r.code == 0 {
		t.Fatal("the profile's token went to another gateway")
	}
	for _, req := range other.sent() {
		if req.Auth != "" {
			t.Errorf("another gateway got Authorization %q", req.Auth)
		}
	}

	if runtime.GOOS == "windows" {
		return
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	r = fleetctl(t, env, "token", "list")
	if r.code == 0 || !strings.Contains(r.stderr, "chmod 600") {
		t.Errorf("a world-readable profile was used: exit %d\n%s", r.code, r.stderr)
	}
}

// A command line fleetctl login cannot use is refused before anything
// is sent.
func TestLoginRefuses(t *testing.T) {
	env := map[string]string{profile.EnvPath: filepath.Join(t.TempDir(), "p.json")}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"login"}, "needs --gateway"},
		{[]string{"login", "--gateway", "https://g:8443", "--ca_file", "x.pem"}, "--ca_pin"},
		{[]string{"login", "extra", "--gateway", "https://g:8443"}, "no arguments"},
		{[]string{"login", "--gateway", "http://g:8443", "--no_check"}, "HTTPS only"},
	} {
		if r := fleetctl(t, env, tc.args...); r.code == 0 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("fleetctl %s: exit %d\n%s", strings.Join(tc.args, " "), r.code, r.stderr)
		}
	}
}

// A token read from standard input is one line without spaces, or an
// error.
func FuzzReadLine(f *testing.F) {
	f.Add("fmcp_abc\n")
	f.Add(" a b \r\n")
	f.Fuzz(func(t *testing.T, in string) {
		got, err := readLine(strings.NewReader(in), io.Discard, "")
		if err == nil && (got == "" || strings.ContainsAny(got, " \t\r\n")) {
			t.Fatalf("readLine(%q) = %q", in, got)
		}
	})
}
