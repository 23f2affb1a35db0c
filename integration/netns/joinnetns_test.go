//go:build linux

package netns

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/access"

	"github.com/fleetmcp/fleetmcp/integration"
)

// TestJoinFromNetNS is the install story end to end, across a network: an
// operator makes a join token with fleetctl (admin API over HTTPS, the CA
// pinned), and a host that reaches the gateway only over a veth link runs
// the printed `fleet-agent join` command. The agent checks the gateway's
// certificate against the pin before it sends the token, enrols, dials
// NATS over TLS with the CA it got, and shows up in hosts with the
// token's labels; bash runs there. Restarted without a token, it comes
// back; the spent token enrols no second host; revoked, it is cut off.
func TestJoinFromNetNS(t *testing.T) {
	ns := integration.NewNetNS(t)
	natsAddr := net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP)))
	apiAddr := net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP)))
	token, line, err := access.NewAPIToken("operator")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "api-tokens.yaml")
	integration.WriteFile(t, file, "tokens:\n  "+strings.Replace(line, "tools: [read]", `tools: ["*"], admin: true`, 1)+"\n")
	gw := integration.LaunchGatewayProcess(t, token, "--api_tokens", file, "--nats_listen", natsAddr, "--api_listen", apiAddr)
	cs := gw.Client()
	pin := integration.GatewayCAPin(t, gw)
	fleetctl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(integration.FleetctlBinary(t), append([]string{"--gateway", "https://" + apiAddr, "--ca_pin", pin}, args...)...)
		cmd.Env = append(os.Environ(), "FLEET_API_TOKEN="+token)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("fleetctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	const host = "ns-joined"
	out := fleetctl("token", "create", "--labels", "role=web,env=test", "--ttl", "10m", "--uses", "1", "--name", host)
	join := regexp.MustCompile(`fleet-agent join .*`).FindString(out)
	tok := regexp.MustCompile(`fmcp1\.[a-z2-7]{10}\.[A-Za-z0-9_-]{43}`).FindString(out)
	if join == "" || tok == "" || strings.Contains(join, tok) || !strings.Contains(join, "--ca_pin "+pin) || !strings.Contains(join, "https://"+apiAddr) {
		t.Fatalf("fleetctl token create printed no join command for https://%s with pin %s, or a token, or the token on the command line:\n%s", apiAddr, pin, out)
	}

	dir := t.TempDir()
	stateDir := filepath.Join(dir, ".state")
	runFlags := []string{"--state_dir", stateDir, "--cwd", dir, "--heartbeat", "500ms"}
	// The printed command, as the operator pastes it, with the token in a
	// file rather than on standard input.
	tokenFile := filepath.Join(dir, "token")
	integration.WriteFile(t, tokenFile, tok+"\n")
	args := strings.Fields(strings.Replace(join, "--token_file -", "--token_file "+tokenFile, 1))[1:]
	a := startInNS(t, ns, append(args, runFlags...)...)
	integration.WaitFor(t, 60*time.Second, host+" online", func() bool { return integration.HostOnline(cs, host) })
	res := integration.Call(t, cs, "hosts", map[string]any{"filter": host})
	if hosts := integration.Text(res); !strings.Contains(hosts, "role=web") || !strings.Contains(hosts, "env=test") {
		t.Errorf("hosts does not show the token's labels:\n%s", hosts)
	}
	if out := integration.MustOK(t, integration.Call(t, cs, "bash", map[string]any{"host": host, "command": "cat /proc/net/dev"})); !strings.Contains(out, ns.NSIf+":") {
		t.Errorf("bash on %s did not run in the namespace:\n%s", host, out)
	}
	if !strings.Contains(fleetctl("token", "list"), "spent") {
		t.Error("the one-use token is not spent after the join")
	}

	// A restart needs no token: the identity is in the state directory.
	a.stop(t)
	integration.WaitFor(t, 30*time.Second, host+" offline", func() bool { return !integration.HostOnline(cs, host) })
	startInNS(t, ns, runFlags...)
	integration.WaitFor(t, 60*time.Second, host+" back online", func() bool { return integration.HostOnline(cs, host) })

	// The spent token enrols nothing more.
	other := filepath.Join(t.TempDir(), ".state")
	cmd := ns.Command(integration.AgentBinary(t), append(args, "--state_dir", other, "--name", "ns-second")...)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "token_spent") {
		t.Errorf("a second join with the spent token: %v\n%s", err, out)
	}

	// Revoked: the live connection is closed and the host stays out.
	fleetctl("agent", "revoke", host)
	integration.WaitFor(t, 10*time.Second, host+" cut off", func() bool { return !integration.HostOnline(cs, host) })
	if !strings.Contains(integration.Text(integration.Call(t, cs, "hosts", map[string]any{"filter": host})), "revoked") {
		t.Error("hosts does not show the revoked host as revoked")
	}
}

// nsProcess is a fleet-agent process in a network namespace.
type nsProcess struct {
	cmd    *exec.Cmd
	done   <-chan struct{}
	stderr *integration.SyncBuffer
	once   sync.Once
}

// startInNS runs fleet-agent with args in ns, stopped with the test.
func startInNS(t *testing.T, ns *integration.NetNS, args ...string) *nsProcess {
	t.Helper()
	p := &nsProcess{stderr: &integration.SyncBuffer{}}
	p.cmd = ns.Command(integration.AgentBinary(t), args...)
	p.cmd.Stderr = io.MultiWriter(p.stderr, integration.TestLog(t))
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start fleet-agent in %s: %v", ns.Name, err)
	}
	p.done = integration.WaitProcess(p.cmd)
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop ends the agent with SIGTERM (it drains), or kills it after 20 s.
func (p *nsProcess) stop(t *testing.T) {
	p.once.Do(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			t.Error("the agent in the namespace did not stop within 20s of SIGTERM")
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}
