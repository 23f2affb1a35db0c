package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/identity"
)

// env returns a getenv that sees only vars, so the tests do not depend on
// the environment they run in.
func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// runFails runs the agent with args and returns the error it must fail
// with. A run that starts instead of failing is stopped and reported.
func runFails(t *testing.T, args []string, vars map[string]string) (stderrText string, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, env(vars), &stderr) }()
	select {
	case err = <-done:
		if err == nil {
			t.Fatalf("run(%q) = nil, want an error", args)
		}
		return stderr.String(), err
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatalf("run(%q) started instead of refusing its flags", args)
		return "", nil
	}
}

// enrolled writes an identity for host into a new state directory, as
// fleet-agent join does, and returns the directory. The credential is
// signed by a key no server trusts: these tests never reach NATS.
func enrolled(t *testing.T, host string) string {
	t.Helper()
	dir := t.TempDir()
	kp, _ := nkeys.CreateUser()
	writeIdentity(t, dir, host, kp, kp)
	return dir
}

// writeIdentity writes into dir the key of keyOwner and a credential for
// host issued for the key of jwtFor.
func writeIdentity(t *testing.T, dir, host string, keyOwner, jwtFor nkeys.KeyPair) {
	t.Helper()
	acc, _ := nkeys.CreateAccount()
	pub, _ := jwtFor.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = host
	uc.Expires = time.Now().Add(time.Hour).Unix()
	token, err := uc.Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	store := identity.Open(dir)
	seed, _ := keyOwner.Seed()
	if err := os.MkdirAll(store.Dir(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(store.Dir(), identity.KeyFile), seed, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := store.SaveJWT(token); err != nil {
		t.Fatal(err)
	}
	if err := store.SaveEnrolment(&identity.Enrolment{Host: host, NATSURLs: []string{"nats://127.0.0.1:1"}, EnrolledAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	state := enrolled(t, "web-1")
	nats := "nats://127.0.0.1:4222"
	typo := filepath.Join(dir, "typo.yaml")
	if err := os.WriteFile(typo, []byte("tools: {deny: [write]}\nbash: {alow: [ls]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	policyEnv := map[string]string{"FLEET_POLICY": typo}
	otherKey := t.TempDir()
	mine, _ := nkeys.CreateUser()
	theirs, _ := nkeys.CreateUser()
	writeIdentity(t, otherKey, "web-1", mine, theirs)
	noJWT := enrolled(t, "web-1")
	if err := os.Remove(filepath.Join(noJWT, identity.Dir, identity.JWTFile)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		vars map[string]string
		want []string
	}{
		{"unknown flag", []string{"--bogus"}, nil, []string{"bogus", "not defined"}},
		{"stray argument", []string{"--nats", nats, "extra"}, nil, []string{`unexpected argument "extra"`}},
		{"flag after argument", []string{"web-1", "--nats", nats}, nil, []string{`unexpected argument "web-1"`}},
		{"labels are the operator's", []string{"--label", "role=web", "--state_dir", state}, nil, []string{"-label", "not defined"}},
		{"password flags are gone", []string{"--nats_password_file", "p", "--state_dir", state}, nil, []string{"-nats_password_file", "not defined"}},
		{"bad duration", []string{"--heartbeat", "often"}, nil, []string{"heartbeat", "often"}},
		{"not enrolled", []string{"--nats", nats, "--state_dir", dir}, nil, []string{"not enrolled", dir, "fleet-agent join", "fleetctl token create"}},
		{"enrolment interrupted", []string{"--state_dir", noJWT}, nil, []string{"not enrolled", "no credential", "fleet-agent join"}},
		{"credential of another key", []string{"--state_dir", otherKey}, nil, []string{"is for key", "not for this agent's key", "enrol the host again"}},
		{"another name", []string{"--name", "web-2", "--state_dir", state}, nil, []string{"--name web-2", `enrolled as "web-1"`, "drop --name"}},
		{"bad log level", []string{"--nats", nats, "--log_level", "loud"}, nil, []string{"--log_level", `"loud"`, "debug, info, warn or error"}},
		{"policy typo", []string{"--nats", nats, "--state_dir", state, "--policy", typo}, nil, []string{"typo.yaml", "line 2", `unknown key "alow"`}},
		{"policy from environment", []string{"--nats", nats, "--state_dir", state}, policyEnv, []string{"typo.yaml", `unknown key "alow"`}},
		{"task timeouts", []string{"--nats", nats, "--state_dir", state, "--task_timeout", "48h"}, nil, []string{"--task_timeout 48h0m0s", "--task_max_timeout 24h0m0s"}},
		{"no tasks", []string{"--nats", nats, "--state_dir", state, "--max_tasks", "-1"}, nil, []string{"--max_tasks", "at least 1, not -1"}},
		{"http URL", []string{"--nats", "http://127.0.0.1:8080/mcp", "--state_dir", state}, nil, []string{"--nats", "HTTP URL, not a NATS one", "nats://HOST:4222", "tls://HOST:4222"}},
		{"https URL among others", []string{"--nats", nats + ",https://fleet.example", "--state_dir", state}, nil, []string{"https://fleet.example", "HTTP URL"}},
		{"unknown scheme", []string{"--nats", "ftp://127.0.0.1:4222", "--state_dir", state}, nil, []string{`unknown scheme "ftp"`}},
		{"http URL from the environment", []string{"--state_dir", state}, map[string]string{"FLEET_NATS_URL": "http://gw:8080"}, []string{"HTTP URL"}},
		{"empty protected path", []string{"--nats", nats, "--protect_path", ""}, nil, []string{"protect_path", "empty path"}},
		{"bash lines", []string{"--nats", nats, "--state_dir", state, "--bash_max_lines", "-5"}, nil, []string{"--bash_max_lines", "-5 lines", "1 to 100000"}},
		{"bash bytes", []string{"--nats", nats, "--state_dir", state, "--bash_max_bytes", "100"}, nil, []string{"--bash_max_bytes", "100 bytes", "1024 (1 KiB) to 4194304 (4 MiB)"}},
		{"bash bytes too many", []string{"--nats", nats, "--state_dir", state, "--bash_max_bytes", "8388608"}, nil, []string{"--bash_max_bytes", "out of range"}},
		{"missing policy", []string{"--nats", nats, "--state_dir", state, "--policy", filepath.Join(dir, "nope.yaml")}, nil, []string{"host policy", "nope.yaml", "no such file"}},
		{"collector URL", []string{"--nats", nats, "--state_dir", state, "--otlp_endpoint", "127.0.0.1:4318"}, nil, []string{"--otlp_endpoint", "http:// or https://"}},
		{"collector protocol", []string{"--nats", nats, "--state_dir", state}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			[]string{"OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf only"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runFails(t, tc.args, tc.vars)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("run(%q) = %q, want it to mention %s", tc.args, err, w)
				}
			}
		})
	}
}

func TestRunHelp(t *testing.T) {
	stderr, err := runFails(t, []string{"-h"}, nil)
	if !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run(-h) = %v, want flag.ErrHelp", err)
	}
	for _, f := range []string{"fleet-agent join", "fleet-agent install", "-nats", "-name", "-state_dir", "-log_level", "-policy", "-skills_dir", "-task_timeout", "-max_tasks", "-task_retention", "-max_task_output_mib"} {
		if !strings.Contains(stderr, f) {
			t.Errorf("usage does not list %s:\n%s", f, stderr)
		}
	}
}

// The NATS URL may come from the environment, overriding the enrolment's.
// With no server there, the agent keeps dialling (it never gives up)
// until its context ends, and then stops cleanly.
func TestRunTakesEnvironment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	vars := map[string]string{"FLEET_NATS_URL": "nats://127.0.0.1:2"}
	var stderr bytes.Buffer
	start := time.Now()
	skills := filepath.Join(t.TempDir(), "skills")
	err := run(ctx, []string{"--state_dir", enrolled(t, "web-1"), "--skills_dir", skills, "--drain_timeout", "1s"}, env(vars), &stderr)
	if err != nil {
		t.Fatalf("run = %v, want nil after the context ended\n%s", err, stderr.String())
	}
	if elapsed := time.Since(start); elapsed < 900*time.Millisecond || elapsed > 10*time.Second {
		t.Errorf("run returned after %v, want shortly after its 1s context ended", elapsed)
	}
	for _, w := range []string{"agent starting", "skills_dir=" + skills, "nats://127.0.0.1:2", "host=web-1"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("the agent did not start as asked (%q):\n%s", w, stderr.String())
		}
	}
}

// The startup log says which policy the agent enforces, one line per
// dimension, and says "unrestricted" where that is the case.
func TestRunLogsPolicy(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("# read-only\ntools: {deny: [write, edit]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		vars map[string]string
		want []string
	}{
		{"none", nil, []string{"host policy: none given", "host policy: tools: unrestricted", "host policy: skills: unrestricted"}},
		{"file", map[string]string{"FLEET_POLICY": file}, []string{"digest=sha256:", "host policy: tools: deny edit, write",
			"host policy: paths: unrestricted", "host policy: bash: unrestricted", "host policy: skills: unrestricted"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			vars := map[string]string{}
			for k, v := range tt.vars {
				vars[k] = v
			}
			var stderr bytes.Buffer
			if err := run(ctx, []string{"--state_dir", enrolled(t, "web-1"), "--drain_timeout", "1s"}, env(vars), &stderr); err != nil {
				t.Fatalf("run = %v\n%s", err, stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("log does not mention %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

// A second agent on the state directory of a running one is refused at
// once, naming the first.
func TestRunStateDirInUse(t *testing.T) {
	state := enrolled(t, "web-1")
	vars := map[string]string{}
	args := []string{"--state_dir", state, "--drain_timeout", "1s"}
	ctx, cancel := context.WithCancel(context.Background())
	var firstLog syncBuffer
	first := make(chan error, 1)
	go func() { first <- run(ctx, args, env(vars), &firstLog) }()
	defer func() { cancel(); <-first }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(firstLog.String(), "agent starting") {
		if time.Now().After(deadline) {
			t.Fatalf("the first agent did not start:\n%s", firstLog.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, err := runFails(t, args, vars)
	want := "state directory " + state + " is in use by another fleet-agent (pid " + strconv.Itoa(os.Getpid()) + ")"
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "--state_dir") {
		t.Errorf("second agent: %v; want %q and a hint at --state_dir", err, want)
	}
}

// syncBuffer is a bytes.Buffer that run may write to while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// --config sets the agent's flags from YAML: an unknown key is an error
// naming it, the file's settings reach the agent, and the command line
// wins over the file.
func TestRunConfigFile(t *testing.T) {
	dir := t.TempDir()
	state := enrolled(t, "web-1")
	typo := filepath.Join(dir, "typo.yaml")
	if err := os.WriteFile(typo, []byte("bash: {alow: [ls]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := func(text string) string {
		p := filepath.Join(t.TempDir(), "agent.yaml")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"unknown key", []string{"--config", conf("state_dir: " + state + "\nhearbeat: 1s\n")}, []string{"agent.yaml", `unknown key "hearbeat"`}},
		{"settings reach the agent", []string{"--config", conf("state_dir: " + state + "\npolicy: " + typo + "\n")}, []string{"typo.yaml", `unknown key "alow"`}},
		{"bad value", []string{"--config", conf("heartbeat: often\n")}, []string{"agent.yaml", "heartbeat", "often"}},
		{"command line wins", []string{"--config", conf("state_dir: " + state + "\nmax_tasks: 4\n"), "--max_tasks", "-1"}, []string{"--max_tasks", "not -1"}},
		{"protect_path is the command line's", []string{"--config", conf("protect_path: [/a, /b]\n")}, []string{`"protect_path" is a command-line flag only`}},
		{"token is the command line's", []string{"join", "--config", conf("token: secret\n")}, []string{`"token" is a command-line flag only`}},
		{"join reads it", []string{"join", "--config", conf("ca_pin: nonsense\ngateway: https://gw.example:8443\ntoken_file: /nonexistent\nstate_dir: " + dir + "\n")}, []string{"nonexistent"}},
		{"missing file", []string{"--config", filepath.Join(dir, "none.yaml")}, []string{"--config", "none.yaml"}},
		{"collector from the file", []string{"--config", conf("state_dir: " + state + "\notlp_endpoint: ftp://collector\n")}, []string{"--otlp_endpoint", "ftp://collector"}},
		{"the service's file has run flags only", []string{"install", "--prefix", dir, "--config", conf("user: x\n")}, []string{`unknown key "user"`, "installed service"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := runFails(t, tc.args, nil)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("run(%q) = %q, want it to mention %s", tc.args, err, w)
				}
			}
		})
	}
}
