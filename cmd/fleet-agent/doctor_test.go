package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fleet-agent doctor prints a line per check and fails when one fails;
// it reads the run flags, --config included.
func TestDoctor(t *testing.T) {
	state := enrolled(t, "web-1")
	if err := os.Chmod(state, 0o700); err != nil {
		t.Fatal(err)
	}
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, []byte("bash: {alow: [ls]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(conf, []byte("state_dir: "+state+"\npolicy: "+policy+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	err := runDoctor(context.Background(), []string{"--config", conf, "--timeout", "2s"}, env(nil), &out, &errOut)
	if !errors.Is(err, errChecksFailed) {
		t.Fatalf("err = %v, want the checks to fail", err)
	}
	for _, want := range []string{
		"ok    state dir", "ok    credential ", "ok    fleet API        not checked",
		"FAIL  host policy", `unknown key "alow"`,
		"FAIL  nats nats://127.0.0.1:1", "ok    state lock       free",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runDoctor(context.Background(), []string{"--timeout", "0s"}, env(nil), &out, &errOut); err == nil || !strings.Contains(err.Error(), "--timeout") {
		t.Errorf("--timeout 0: %v", err)
	}
}

// doctor checks the agent as its service runs it: the flags of the unit
// and its environment file (--unit), the NATS URLs of --nats or
// FLEET_NATS_URL over those of the enrolment, flags given on its command
// line last.
func TestDoctorServiceFlags(t *testing.T) {
	state := enrolled(t, "web-1")
	if err := os.Chmod(state, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte("bash: {alow: [ls]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	envFile := filepath.Join(dir, "agent.env")
	if err := os.WriteFile(envFile, []byte("# the service's settings\nFLEET_AGENT_FLAGS=\"--policy "+policy+" --nats nats://127.0.0.1:2\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(dir, "fleet-agent.service")
	if err := os.WriteFile(unit, []byte("[Unit]\nDescription=x\n[Service]\nEnvironmentFile="+envFile+"\nExecStart=/usr/bin/fleet-agent --state_dir "+state+" $FLEET_AGENT_FLAGS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	doctorOut := func(args []string, vars map[string]string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := runDoctor(context.Background(), append(args, "--timeout", "2s"), env(vars), &out, &errOut); !errors.Is(err, errChecksFailed) {
			t.Fatalf("%q: err = %v, want the checks to fail\n%s", args, err, errOut.String())
		}
		return out.String()
	}
	out := doctorOut([]string{"--unit", unit}, nil)
	for _, want := range []string{"ok    service          the flags of " + unit + ", " + envFile, "ok    state dir        " + state,
		"FAIL  host policy", "FAIL  nats nats://127.0.0.1:2", "from --nats (FLEET_NATS_URL)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "127.0.0.1:1") {
		t.Errorf("doctor checked the enrolment's NATS URL, not the service's --nats:\n%s", out)
	}
	// A flag given to doctor wins over the service's.
	if out := doctorOut([]string{"--unit", unit, "--nats", "nats://127.0.0.1:4"}, nil); !strings.Contains(out, "nats nats://127.0.0.1:4") || strings.Contains(out, "FAIL  nats nats://127.0.0.1:2") {
		t.Errorf("--nats after the service's:\n%s", out)
	}
	// Without a unit, FLEET_NATS_URL is the agent's --nats.
	if out := doctorOut([]string{"--unit", "off", "--state_dir", state}, map[string]string{"FLEET_NATS_URL": "nats://127.0.0.1:3"}); !strings.Contains(out, "nats nats://127.0.0.1:3") || strings.Contains(out, "FAIL  nats nats://127.0.0.1:1") {
		t.Errorf("FLEET_NATS_URL:\n%s", out)
	}
	var out2, errOut bytes.Buffer
	if err := runDoctor(context.Background(), []string{"--unit", filepath.Join(dir, "none.service")}, env(nil), &out2, &errOut); err == nil || !strings.Contains(err.Error(), "--unit") {
		t.Errorf("a missing unit: %v", err)
	}
}
