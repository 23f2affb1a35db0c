package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
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

func TestRunRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	emptyFile := filepath.Join(dir, "empty")
	if err := os.WriteFile(emptyFile, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withPassword := map[string]string{"FLEET_NATS_PASSWORD": "secret"}
	nats := "nats://127.0.0.1:4222"
	typo := filepath.Join(dir, "typo.yaml")
	if err := os.WriteFile(typo, []byte("tools: {deny: [write]}\nbash: {alow: [ls]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	policyEnv := map[string]string{"FLEET_NATS_PASSWORD": "secret", "FLEET_POLICY": typo}
	tests := []struct {
		name string
		args []string
		vars map[string]string
		want []string
	}{
		{"unknown flag", []string{"--bogus"}, withPassword, []string{"bogus", "not defined"}},
		{"stray argument", []string{"--nats", nats, "extra"}, withPassword, []string{`unexpected argument "extra"`}},
		{"flag after argument", []string{"web-1", "--nats", nats}, withPassword, []string{`unexpected argument "web-1"`}},
		{"label without value", []string{"--label", "role"}, withPassword, []string{"label", `"role"`, "key=value"}},
		{"label without key", []string{"--label", "=web"}, withPassword, []string{"label", `"=web"`, "key=value"}},
		{"label with blank key", []string{"--label", " =web"}, withPassword, []string{"label", "key=value"}},
		{"bad duration", []string{"--heartbeat", "often"}, withPassword, []string{"heartbeat", "often"}},
		{"missing password", []string{"--nats", nats}, nil, []string{"no NATS password", "FLEET_NATS_PASSWORD", "--nats_password_file"}},
		{"empty password file", []string{"--nats", nats, "--nats_password_file", emptyFile}, nil, []string{"no NATS password"}},
		{"missing password file", []string{"--nats", nats, "--nats_password_file", filepath.Join(dir, "nope")}, nil, []string{"--nats_password_file", "nope"}},
		{"bad log level", []string{"--nats", nats, "--log_level", "loud"}, withPassword, []string{"--log_level", `"loud"`, "debug, info, warn or error"}},
		{"no server", []string{"--name", "web-1", "--state_dir", dir}, withPassword, []string{"no NATS server", "--nats"}},
		{"bad name", []string{"--nats", nats, "--name", "web.1", "--state_dir", dir}, withPassword, []string{"--name", `"web.1"`}},
		{"policy typo", []string{"--nats", nats, "--name", "web-1", "--state_dir", dir, "--policy", typo}, withPassword, []string{"typo.yaml", "line 2", `unknown key "alow"`}},
		{"policy from environment", []string{"--nats", nats, "--name", "web-1", "--state_dir", dir}, policyEnv, []string{"typo.yaml", `unknown key "alow"`}},
		{"task timeouts", []string{"--nats", nats, "--name", "web-1", "--state_dir", dir, "--task_timeout", "48h"}, withPassword, []string{"--task_timeout 48h0m0s", "--task_max_timeout 24h0m0s"}},
		{"no tasks", []string{"--nats", nats, "--name", "web-1", "--state_dir", dir, "--max_tasks", "-1"}, withPassword, []string{"--max_tasks", "at least 1, not -1"}},
		{"http URL", []string{"--nats", "http://127.0.0.1:8080/mcp", "--name", "web-1", "--state_dir", dir}, withPassword, []string{"--nats", "HTTP URL, not a NATS one", "nats://HOST:4222", "tls://HOST:4222"}},
		{"https URL among others", []string{"--nats", nats + ",https://fleet.example", "--name", "web-1", "--state_dir", dir}, withPassword, []string{"https://fleet.example", "HTTP URL"}},
		{"unknown scheme", []string{"--nats", "ftp://127.0.0.1:4222", "--name", "web-1", "--state_dir", dir}, withPassword, []string{`unknown scheme "ftp"`}},
		{"http URL from the environment", []string{"--name", "web-1", "--state_dir", dir}, map[string]string{"FLEET_NATS_PASSWORD": "secret", "FLEET_NATS_URL": "http://gw:8080"}, []string{"HTTP URL"}},
		{"empty protected path", []string{"--nats", nats, "--protect_path", ""}, withPassword, []string{"protect_path", "empty path"}},
		{"missing policy", []string{"--nats", nats, "--name", "web-1", "--state_dir", dir, "--policy", filepath.Join(dir, "nope.yaml")}, withPassword, []string{"host policy", "nope.yaml", "no such file"}},
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
	for _, f := range []string{"-nats", "-name", "-label", "-nats_password_file", "-log_level", "-policy", "-skills_dir", "-task_timeout", "-max_tasks", "-task_retention", "-max_task_output_mib"} {
		if !strings.Contains(stderr, f) {
			t.Errorf("usage does not list %s:\n%s", f, stderr)
		}
	}
}

// The NATS URL and password may come from the environment alone. With no
// server there, the agent keeps dialling (it never gives up) until its
// context ends, and then stops cleanly.
func TestRunTakesEnvironment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	vars := map[string]string{"FLEET_NATS_URL": "nats://127.0.0.1:1", "FLEET_NATS_PASSWORD": "secret"}
	var stderr bytes.Buffer
	start := time.Now()
	skills := filepath.Join(t.TempDir(), "skills")
	err := run(ctx, []string{"--name", "web-1", "--state_dir", t.TempDir(), "--skills_dir", skills, "--drain_timeout", "1s"}, env(vars), &stderr)
	if err != nil {
		t.Fatalf("run = %v, want nil after the context ended\n%s", err, stderr.String())
	}
	if elapsed := time.Since(start); elapsed < 900*time.Millisecond || elapsed > 10*time.Second {
		t.Errorf("run returned after %v, want shortly after its 1s context ended", elapsed)
	}
	if !strings.Contains(stderr.String(), "agent starting") || !strings.Contains(stderr.String(), "skills_dir="+skills) {
		t.Errorf("the agent did not start:\n%s", stderr.String())
	}
}

// The password read from the environment leaves it, so that nothing the
// agent starts finds it there.
func TestRunUnsetsPassword(t *testing.T) {
	t.Setenv("FLEET_NATS_PASSWORD", "secret")
	// A bad name fails after the password is read and before anything
	// starts.
	args := []string{"--nats", "nats://127.0.0.1:4222", "--name", "web.1", "--state_dir", t.TempDir()}
	err := run(context.Background(), args, os.Getenv, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--name") {
		t.Fatalf("run(%q) = %v, want the bad name refused", args, err)
	}
	if v, ok := os.LookupEnv("FLEET_NATS_PASSWORD"); ok {
		t.Errorf("FLEET_NATS_PASSWORD is still set (%q) after run read it", v)
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
			vars := map[string]string{"FLEET_NATS_URL": "nats://127.0.0.1:1", "FLEET_NATS_PASSWORD": "secret"}
			for k, v := range tt.vars {
				vars[k] = v
			}
			var stderr bytes.Buffer
			if err := run(ctx, []string{"--name", "web-1", "--state_dir", t.TempDir(), "--drain_timeout", "1s"}, env(vars), &stderr); err != nil {
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
	state := t.TempDir()
	vars := map[string]string{"FLEET_NATS_URL": "nats://127.0.0.1:1", "FLEET_NATS_PASSWORD": "secret"}
	args := []string{"--name", "web-1", "--state_dir", state, "--drain_timeout", "1s"}
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
	_, err := runFails(t, append([]string{"--name", "web-2"}, args[2:]...), vars)
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
