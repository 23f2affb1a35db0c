package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/agent/identity/identitytest"
)

// runUntil runs the agent with args until its log says "agent starting",
// then stops it, and returns the log.
func runUntil(t *testing.T, args []string, vars map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log syncBuffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(vars), &log) }()
	deadline := time.After(20 * time.Second)
	for !strings.Contains(log.String(), "agent starting") {
		select {
		case err := <-done:
			t.Fatalf("run(%q) = %v before the agent started\n%s", args, err, log.String())
		case <-deadline:
			t.Fatalf("run(%q): the agent did not start\n%s", args, log.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run(%q) = %v after its context ended\n%s", args, err, log.String())
	}
	return log.String()
}

// fleet-agent join enrols with the token from a file, then runs as a
// plain start; run again, it sends nothing and runs; a plain start runs
// with the identity join wrote.
func TestJoinThenRun(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	natsURL := g.ServeNATSGreeting(t)
	state := t.TempDir()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(g.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"join", "--gateway", g.URL, "--token_file", tokenFile, "--ca_pin", g.Pin, "--name", "web-1",
		"--state_dir", state, "--drain_timeout", "1s"}
	out := runUntil(t, args, nil)
	if !strings.Contains(out, "msg=enrolled host=web-1") || g.Requests() != 1 {
		t.Errorf("join: %d requests\n%s", g.Requests(), out)
	}
	if _, err := identity.Load(state); err != nil {
		t.Fatal(err)
	}
	out = runUntil(t, args, nil)
	if !strings.Contains(out, "enrolled already") || g.Requests() != 1 {
		t.Errorf("second join: %d requests\n%s", g.Requests(), out)
	}
	out = runUntil(t, []string{"--state_dir", state, "--drain_timeout", "1s"}, nil)
	if !strings.Contains(out, "host=web-1") || !strings.Contains(out, natsURL) {
		t.Errorf("plain start after join:\n%s", out)
	}
	// The token from the environment, the CA pin and gateway too.
	state2 := t.TempDir()
	out = runUntil(t, []string{"join", "--name", "web-2", "--state_dir", state2, "--drain_timeout", "1s"},
		map[string]string{"FLEET_JOIN_TOKEN": g.Token, "FLEET_GATEWAY": g.URL, "FLEET_CA_PIN": g.Pin})
	if !strings.Contains(out, "msg=enrolled host=web-2") {
		t.Errorf("join from the environment:\n%s", out)
	}
}

// Join refuses bad or missing options before it sends anything.
func TestJoinRefusesBadFlags(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := t.TempDir()
	tokenFile := filepath.Join(t.TempDir(), "token")
	_ = os.WriteFile(tokenFile, []byte(g.Token), 0o600)
	badPolicy := filepath.Join(t.TempDir(), "policy.yaml")
	_ = os.WriteFile(badPolicy, []byte("tools: {allow: [no_such_tool]}\n"), 0o600)
	big := filepath.Join(t.TempDir(), "big")
	_ = os.WriteFile(big, []byte(strings.Repeat("x", 5000)), 0o600)
	base := func(extra ...string) []string {
		return append([]string{"join", "--gateway", g.URL, "--ca_pin", g.Pin, "--state_dir", state}, extra...)
	}
	for _, tc := range []struct {
		name string
		args []string
		vars map[string]string
		want string
	}{
		{"no token", base(), nil, "no join token"},
		{"two tokens", base("--token", g.Token, "--token_file", tokenFile), nil, "both given"},
		{"missing token file", base("--token_file", filepath.Join(state, "nope")), nil, "--token_file"},
		{"huge token file", base("--token_file", big), nil, "not a join token"},
		{"bad token", base("--token", "fmcp1.x.y"), nil, "not a join token"},
		{"http", []string{"join", "--gateway", strings.Replace(g.URL, "https", "http", 1), "--ca_pin", g.Pin, "--token", g.Token, "--state_dir", state}, nil, "plain http"},
		{"no gateway", []string{"join", "--ca_pin", g.Pin, "--token", g.Token, "--state_dir", state}, nil, "no gateway"},
		{"no pin", []string{"join", "--gateway", g.URL, "--token", g.Token, "--state_dir", state}, nil, "no CA pin"},
		{"bad pin", []string{"join", "--gateway", g.URL, "--ca_pin", "sha256:00", "--token", g.Token, "--state_dir", state}, nil, "--ca_pin"},
		{"bad name", base("--token", g.Token, "--name", "a.b"), nil, "--name"},
		{"stray argument", base("--token", g.Token, "extra"), nil, `unexpected argument "extra"`},
		{"wrong CA", []string{"join", "--gateway", g.URL, "--ca_pin", identitytest.NewCA(t, "x").Pin(), "--token", g.Token, "--state_dir", state}, nil, "holds no CA certificate of the pin"},
		{"broken policy", base("--token", g.Token, "--policy", badPolicy), nil, "nothing was enrolled"},
		{"missing policy", base("--token", g.Token, "--policy", filepath.Join(state, "nope.yaml")), nil, "nothing was enrolled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runFails(t, tc.args, tc.vars)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want it to say %q", err, tc.want)
			}
		})
	}
	if g.Requests() != 0 {
		t.Errorf("refused joins sent %d requests", g.Requests())
	}
}

// fleet-agent install with --prefix and --no_start writes the files, the
// agent's flags into the unit and the policy into the environment file's
// FLEET_AGENT_FLAGS;
// run again, it changes nothing.
func TestInstallCommand(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	prefix := t.TempDir()
	work := t.TempDir()
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte("tools:\n  deny: [write]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"install", "--prefix", prefix, "--no_start", "--gateway", g.URL, "--token", g.Token, "--ca_pin", g.Pin,
		"--name", "web-1", "--policy", policyFile, "--cwd", work, "--max_concurrent", "4", "--protect_path", "/srv/secret", "--protect_path", "/srv/other"}
	var log syncBuffer
	if err := run(context.Background(), args, env(nil), &log); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	unit, err := os.ReadFile(filepath.Join(prefix, "etc/systemd/system/fleet-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	wantExec := "ExecStart=/usr/local/bin/fleet-agent --state_dir /var/lib/fleetmcp-agent --cwd=" + work + " --max_concurrent=4 --protect_path=/srv/secret --protect_path=/srv/other $FLEET_AGENT_FLAGS\n"
	if !strings.Contains(string(unit), wantExec) {
		t.Errorf("the unit lacks\n%s\n%s", wantExec, unit)
	}
	envFile, _ := os.ReadFile(filepath.Join(prefix, "etc/fleetmcp/agent.env"))
	if !strings.Contains(string(envFile), `FLEET_AGENT_FLAGS="--policy `+policyFile+`"`) {
		t.Errorf("the env file:\n%s", envFile)
	}
	if _, err := identity.Load(filepath.Join(prefix, "var/lib/fleetmcp-agent")); err != nil {
		t.Fatal(err)
	}
	log = syncBuffer{}
	if err := run(context.Background(), args, env(nil), &log); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(log.String(), "written") || g.Requests() != 1 {
		t.Errorf("the second install: %d requests\n%s", g.Requests(), log.String())
	}
	if _, err := runFails(t, append(args, "--state_dir", t.TempDir()), nil); err == nil || !strings.Contains(err.Error(), "--state_dir") {
		t.Errorf("install with --state_dir: %v", err)
	}
}

// A join whose NATS URLs do not work from the host keeps the enrolment
// but fails, naming the URL, the error and what to run on the gateway;
// once the gateway gives a URL that works, join asks for it and runs.
func TestJoinChecksNATS(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := t.TempDir()
	args := []string{"join", "--gateway", g.URL, "--name", "web-1", "--state_dir", state, "--drain_timeout", "1s"}
	vars := map[string]string{"FLEET_JOIN_TOKEN": g.Token, "FLEET_CA_PIN": g.Pin}
	var log syncBuffer
	err := run(context.Background(), args, env(vars), &log)
	if err == nil {
		t.Fatalf("join with NATS out of reach succeeded\n%s", log.String())
	}
	for _, want := range []string{"host web-1 is enrolled", "NATS is not reachable at tls://127.0.0.1:1", "connection refused",
		"restart fleet-gateway with --advertise 127.0.0.1", "asks the gateway for the current NATS URLs by itself"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q:\n%v", want, err)
		}
	}
	if _, err := identity.Load(state); err != nil {
		t.Fatalf("the enrolment was not kept: %v", err)
	}
	natsURL := g.ServeNATSGreeting(t)
	out := runUntil(t, args, vars)
	if !strings.Contains(out, "enrolled already") || !strings.Contains(out, natsURL) || g.Requests() != 1 || g.Locates() == 0 {
		t.Errorf("join once the gateway gives a good URL: %d enrolments, %d locates\n%s", g.Requests(), g.Locates(), out)
	}
	if id, err := identity.Load(state); err != nil || id.Enrolment.NATSURLs[0] != natsURL {
		t.Errorf("the new URL is not stored: %v", err)
	}
}

func TestExitStatus(t *testing.T) {
	if got := exitStatus(fmt.Errorf("run: %w", &agent.RevokedError{Host: "web-1", Err: errors.New("revoked")})); got != 77 {
		t.Errorf("revoked: exit status %d", got)
	}
	if got := exitStatus(errors.New("other")); got != 2 {
		t.Errorf("another error: exit status %d", got)
	}
}
