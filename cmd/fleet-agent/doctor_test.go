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
