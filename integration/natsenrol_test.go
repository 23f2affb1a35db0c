//go:build unix

package integration

import (
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestJoinOverNATSOnly is enrolment for a host that reaches the gateway's
// NATS server but no fleet API (it is off): the fleet-agent binary runs
// the join command made for a NATS join token, with the token in a file.
// A wrong pin is refused before the token is sent (the token keeps its
// use); with the right one the agent enrols over NATS, comes online with
// the token's labels and runs bash; the spent token enrols no second
// host.
func TestJoinOverNATSOnly(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.NATSTLS = true; c.APIListen = "" }})
	gw := env.Gateway
	if gw.APIAddr() != "" {
		t.Fatalf("the fleet API listens at %s", gw.APIAddr())
	}
	const host = "edge-1"
	resp, err := gw.CreateJoinToken(context.Background(), &protocol.TokenCreateRequest{Name: host, Labels: map[string]string{"site": "far"}, NATS: true}, "test")
	if err != nil {
		t.Fatal(err)
	}
	join := resp.JoinCommand
	if !regexp.MustCompile(`^fleet-agent join --nats tls://\S+ --ca_pin sha256:[0-9a-f]{64} --name edge-1 --token_file -$`).MatchString(join) {
		t.Fatalf("join command %q", join)
	}
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, resp.Token+"\n")
	args := strings.Fields(strings.Replace(join, "--token_file -", "--token_file "+tokenFile, 1))[1:]
	// The embedded server's URL, as this test reaches it.
	args[2] = env.NATSURL()
	if !strings.HasPrefix(args[2], "tls://") {
		t.Fatalf("NATS URL %s", args[2])
	}

	// Another pin: refused before anything is sent.
	wrong := append([]string(nil), args...)
	wrong[slices.Index(wrong, "--ca_pin")+1] = "sha256:" + strings.Repeat("0", 64)
	out, err := exec.Command(agentBinary(t), append(wrong, "--state_dir", filepath.Join(dir, ".wrong"), "--cwd", dir)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "holds no CA certificate of the pin") {
		t.Fatalf("a join with another pin: %v\n%s", err, out)
	}
	if ti := tokenInfo(t, gw, resp.Info.ID); ti.Used != 0 {
		t.Fatalf("the token was used by a join with a wrong pin: %+v", ti)
	}

	stateDir := filepath.Join(dir, ".state")
	cmd := exec.Command(agentBinary(t), append(args, "--state_dir", stateDir, "--cwd", dir, "--heartbeat", "500ms")...)
	cmd.Stderr = testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := waitProcess(cmd)
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	env.WaitHost(host, true)
	if h, _ := gw.Host(host); h.Labels["site"] != "far" {
		t.Errorf("the host's labels %v", h.Labels)
	}
	cs := env.Client("", nil)
	if out := mustOK(t, call(t, cs, "bash", map[string]any{"host": host, "command": "echo over-nats"})); !strings.Contains(out, "over-nats") {
		t.Errorf("bash on %s: %s", host, out)
	}
	if ti := tokenInfo(t, gw, resp.Info.ID); ti.State != protocol.TokenSpent {
		t.Errorf("the token after the join: %+v", ti)
	}

	// The spent token (and its revoked credential) enrol no second host.
	out, err = exec.Command(agentBinary(t), append(args, "--state_dir", filepath.Join(dir, ".second"), "--cwd", dir)...).CombinedOutput()
	if err == nil || !regexp.MustCompile(`token_spent|refused the token's credential`).Match(out) {
		t.Errorf("a second join with the spent token: %v\n%s", err, out)
	}
}
