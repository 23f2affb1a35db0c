//go:build linux

package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/access"
)

// TestDoctor runs both doctors, the real binaries, against a real
// gateway process: fleet-agent doctor on an enrolled host while its agent
// runs (everything reachable, the state lock held) and after it stopped;
// fleetctl doctor as an admin (the admin API, the MCP endpoint's
// readiness, the agent's version from the listing), and with a token
// that is not an admin's.
func TestDoctor(t *testing.T) {
	token, line, err := access.NewAPIToken("operator")
	if err != nil {
		t.Fatal(err)
	}
	userToken, userLine, err := access.NewAPIToken("user")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "api-tokens.yaml")
	writeFile(t, file, "tokens:\n  "+strings.Replace(line, "tools: [read]", `tools: ["*"], admin: true`, 1)+"\n  "+userLine+"\n")
	apiAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	gw := launchGatewayProcess(t, token, "--api_tokens", file, "--api_listen", apiAddr)
	cs := gw.Client()
	pin := gatewayCAPin(t, gw)
	fleetctl := func(tok string, args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command(fleetctlBinary(t), append([]string{"--gateway", "https://" + apiAddr, "--ca_pin", pin, "--timeout", "20s"}, args...)...)
		cmd.Env = append(os.Environ(), "FLEET_API_TOKEN="+tok)
		out, err := cmd.CombinedOutput()
		return string(out), exitStatus(t, err)
	}

	const host = "doc-1"
	out, code := fleetctl(token, "token", "create", "--ttl", "10m", "--uses", "1", "--name", host)
	join := regexp.MustCompile(`fleet-agent join .*`).FindString(out)
	tok := regexp.MustCompile(`fmcp1\.[a-z2-7]{10}\.[A-Za-z0-9_-]{43}`).FindString(out)
	if code != 0 || join == "" || tok == "" {
		t.Fatalf("token create: exit %d\n%s", code, out)
	}
	dir := t.TempDir()
	state := filepath.Join(dir, ".state")
	agentCmd := exec.Command(agentBinary(t), append(strings.Fields(join)[1:], "--state_dir", state, "--cwd", dir, "--heartbeat", "500ms")...)
	agentCmd.Stdin, agentCmd.Stderr = strings.NewReader(tok+"\n"), testWriter{t} // the printed command reads the token from stdin
	agentCmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := agentCmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := waitProcess(agentCmd)
	stopAgent := func() {
		_ = agentCmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = agentCmd.Process.Kill()
			<-done
			t.Error("the agent did not stop within 20s of SIGTERM")
		}
	}
	t.Cleanup(stopAgent)
	waitFor(t, 60*time.Second, host+" online", func() bool { return hostOnline(cs, host) })

	doctor := func() (string, int) {
		t.Helper()
		out, err := exec.Command(agentBinary(t), "doctor", "--state_dir", state, "--timeout", "10s").CombinedOutput()
		return string(out), exitStatus(t, err)
	}
	out, code = doctor()
	t.Logf("fleet-agent doctor:\n%s", out)
	if code != 0 {
		t.Errorf("fleet-agent doctor on a running host: exit %d\n%s", code, out)
	}
	for _, want := range []string{"ok    state dir", "ok    credential ttl", "ok    fleet API        https://" + apiAddr, "ok    clock skew",
		"ok    nats nats://127.0.0.1:", "reached; plain NATS", "held: an agent is running on this state directory (pid"} {
		if !strings.Contains(out, want) {
			t.Errorf("fleet-agent doctor output lacks %q:\n%s", want, out)
		}
	}

	out, code = fleetctl(token, "doctor", "--mcp_url", gw.MCPURL)
	t.Logf("fleetctl doctor:\n%s", out)
	if code != 0 {
		t.Errorf("fleetctl doctor: exit %d\n%s", code, out)
	}
	// The agent announces the version fleet-agent --version prints.
	v, err := exec.Command(agentBinary(t), "--version").Output()
	if err != nil {
		t.Fatal(err)
	}
	agentVersion := strings.TrimPrefix(strings.SplitN(string(v), "\n", 2)[0], "fleet-agent ")
	for _, want := range []string{"ok    admin rights       this token is an admin's", "ok    admin API cert", "ok    gateway ready",
		"ok    hosts              1 enrolled, 1 online", "ok    agent versions     " + agentVersion + " (1)", "ok    offline hosts      none"} {
		if !strings.Contains(out, want) {
			t.Errorf("fleetctl doctor output lacks %q:\n%s", want, out)
		}
	}
	out, code = fleetctl(userToken, "doctor")
	if code != 1 || !strings.Contains(out, "FAIL  admin rights") {
		t.Errorf("fleetctl doctor with a token that is not an admin's: exit %d\n%s", code, out)
	}

	stopAgent()
	waitFor(t, 30*time.Second, host+" offline", func() bool { return !hostOnline(cs, host) })
	out, code = doctor()
	if code != 0 || !strings.Contains(out, "free: no agent is running") {
		t.Errorf("fleet-agent doctor on a stopped host: exit %d\n%s", code, out)
	}
	out, _ = fleetctl(token, "doctor")
	if !strings.Contains(out, "warn  offline hosts      "+host) {
		t.Errorf("fleetctl doctor does not report the stopped host offline:\n%s", out)
	}
}

// exitStatus is a finished command's exit code.
func exitStatus(t *testing.T, err error) int {
	t.Helper()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	t.Fatal(err)
	return -1
}
