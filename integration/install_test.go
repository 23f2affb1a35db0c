//go:build linux

package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestInstallBesidePackageWithGateway: the real fleet-agent install, into
// a tree that holds the fleet-agent package's files, against the real
// gateway: a check that fails leaves the tree as it was and the token
// unspent; then it enrols into the package's state directory, writes no
// binary, unit or environment file of its own, and leaves the package's
// as they were; run again with the same command it spends nothing.
func TestInstallBesidePackageWithGateway(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.APIListen = "127.0.0.1:0" }})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tok, err := env.Gateway.CreateJoinToken(ctx, &protocol.TokenCreateRequest{Name: "web-1"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	unit, err := os.ReadFile(filepath.Join(moduleRoot(t), "deploy/systemd/fleet-agent.service"))
	if err != nil {
		t.Fatal(err)
	}
	envFile := "FLEET_AGENT_FLAGS=--policy /etc/fleetmcp/policy.yaml\n"
	for path, data := range map[string]string{"usr/bin/fleet-agent": "the package's binary", "usr/lib/systemd/system/fleet-agent.service": string(unit),
		"etc/fleetmcp/agent.env": envFile} {
		if err := os.MkdirAll(filepath.Join(root, filepath.Dir(path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(tok.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	install := func(extra ...string) (string, error) {
		args := append([]string{"install", "--prefix", root, "--gateway", env.Gateway.APIURL(), "--token_file", tokenFile, "--ca_pin", tok.CAPin, "--name", "web-1"}, extra...)
		cmd := exec.CommandContext(ctx, agentBinary(t), args...)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	used := func() int {
		infos, err := env.Gateway.JoinTokens(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range infos {
			if strings.HasPrefix(tok.Token, protocol.TokenPrefix+"."+i.ID+".") {
				return i.Used
			}
		}
		t.Fatal("the token is not listed")
		return 0
	}

	// Settings that belong in the package's agent.env: refused, the token
	// unspent, nothing written.
	out, err := install("--max_concurrent", "4")
	if err == nil || !strings.Contains(out, "the join token was not used") || !strings.Contains(out, "FLEET_AGENT_FLAGS there") {
		t.Fatalf("install with an agent flag beside the package: %v\n%s", err, out)
	}
	if used() != 0 {
		t.Fatal("a refused install spent the token")
	}
	if _, err := os.Stat(filepath.Join(root, "var/lib/fleetmcp-agent")); err == nil {
		t.Fatal("a refused install made the state directory")
	}

	out, err = install()
	if err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	if !strings.Contains(out, "package: fleet-agent is installed") || used() != 1 {
		t.Errorf("install's report (token used %d):\n%s", used(), out)
	}
	if _, err := identity.Load(filepath.Join(root, "var/lib/fleetmcp-agent")); err != nil {
		t.Fatalf("the package's state directory: %v", err)
	}
	for _, p := range []string{"usr/local/bin/fleet-agent", "etc/systemd/system/fleet-agent.service"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			t.Errorf("install wrote %s, which shadows the package's", p)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(root, "etc/fleetmcp/agent.env")); string(data) != envFile {
		t.Errorf("install rewrote the package's agent.env:\n%s", data)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "usr/bin/fleet-agent")); string(data) != "the package's binary" {
		t.Error("install replaced the package's binary")
	}
	if out, err := install(); err != nil || used() != 1 {
		t.Errorf("install again: %v, token used %d\n%s", err, used(), out)
	}
}
