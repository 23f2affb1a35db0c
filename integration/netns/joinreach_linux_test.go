//go:build linux

package netns

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/gateway/access"

	"github.com/fleetmcp/fleetmcp/integration"
)

// The join pitfalls of a gateway whose addresses do not reach it from the
// hosts, across a network: the host in a namespace reaches the gateway
// only over a veth link.

// joinFleet is a gateway process with an admin API token, and fleetctl
// against it.
type joinFleet struct {
	gw      *integration.GatewayProc
	ns      *integration.NetNS
	apiAddr string // host:port hosts reach the fleet API at
	pin     string
	admin   string // the admin API token
}

// adminTokens writes an API tokens file with one admin token and returns
// the token and the file.
func adminTokens(t *testing.T) (string, string) {
	t.Helper()
	token, line, err := access.NewAPIToken("operator")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "api-tokens.yaml")
	integration.WriteFile(t, file, "tokens:\n  "+strings.Replace(line, "tools: [read]", `tools: ["*"], admin: true`, 1)+"\n")
	return token, file
}

// fleetctl runs fleetctl against the fleet API and returns its output.
func (f *joinFleet) fleetctl(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(integration.FleetctlBinary(t), append([]string{"--gateway", "https://" + f.apiAddr, "--ca_pin", f.pin}, args...)...)
	cmd.Env = append(os.Environ(), "FLEET_API_TOKEN="+f.admin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("fleetctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var joinTokenRE = regexp.MustCompile(`fmcp1\.[a-z2-7]{10}\.[A-Za-z0-9_-]{43}`)

// joinArgs makes a one-use join token for host and returns the arguments
// of fleet-agent join with it (in a file) and the agent's run flags.
func (f *joinFleet) joinArgs(t *testing.T, host, dir string) []string {
	t.Helper()
	tok := joinTokenRE.FindString(f.fleetctl(t, "token", "create", "--ttl", "10m", "--uses", "1", "--name", host))
	if tok == "" {
		t.Fatal("fleetctl token create printed no token")
	}
	tokenFile := filepath.Join(dir, "token")
	integration.WriteFile(t, tokenFile, tok+"\n")
	return []string{"join", "--gateway", "https://" + f.apiAddr, "--ca_pin", f.pin, "--token_file", tokenFile, "--name", host,
		"--state_dir", filepath.Join(dir, ".state"), "--cwd", dir, "--heartbeat", "500ms"}
}

// TestJoinGatewayHostnameLoopback: a gateway on a machine whose hostname
// resolves to 127.0.1.1 (stock Debian), listening on every interface,
// would advertise https://HOSTNAME and tls://HOSTNAME to hosts that then
// dial themselves. It refuses to start, naming the name, the address and
// the fix; with that one --advertise it starts, and a host elsewhere
// joins and is online, its stored NATS URL the advertised address.
func TestJoinGatewayHostnameLoopback(t *testing.T) {
	ns := integration.NewNetNS(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("no unshare command (util-linux)")
	}
	name := "fleetgw-" + strings.TrimPrefix(ns.HostIf, "fmh")
	hosts := filepath.Join(t.TempDir(), "hosts")
	integration.WriteFile(t, hosts, "127.0.0.1 localhost\n127.0.1.1 "+name+"\n")
	natsPort, apiPort := integration.FreePortOn(t, "0.0.0.0"), integration.FreePortOn(t, "0.0.0.0")
	admin, tokens := adminTokens(t)
	dataDir := t.TempDir()
	args := []string{"--listen", fmt.Sprintf("127.0.0.1:%d", integration.FreePort(t)), "--data_dir", dataDir, "--api_tokens", tokens, "--log_level", "warn",
		"--nats_listen", fmt.Sprintf("0.0.0.0:%d", natsPort), "--api_listen", fmt.Sprintf("0.0.0.0:%d", apiPort)}
	// The gateway runs with its own hostname and /etc/hosts, as on such
	// a machine; the network is this one's.
	underName := func(ctx context.Context, extra ...string) *exec.Cmd {
		script := `hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"`
		full := append([]string{"--uts", "--mount", "sh", "-c", script, "sh", name, hosts, integration.GatewayBinary(t)}, append(args, extra...)...)
		return exec.CommandContext(ctx, "unshare", full...)
	}
	if out, err := exec.Command("unshare", "--uts", "--mount", "true").CombinedOutput(); err != nil {
		t.Skipf("cannot make UTS and mount namespaces here: %v: %s", err, out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := underName(ctx).CombinedOutput()
	if err == nil {
		t.Fatalf("the gateway started, advertising %s (127.0.1.1) to other machines:\n%s", name, out)
	}
	for _, want := range []string{"https://" + name + ":" + strconv.Itoa(apiPort), name + " resolves to 127.0.1.1", "--advertise NAME", "--nats_advertise overrides"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal lacks %q:\n%s", want, out)
		}
	}

	// One --advertise fixes the fleet API's URL and the NATS URL both.
	gw := integration.StartGatewayCommand(t, underName(context.Background(), "--advertise", ns.HostIP), args[1], dataDir, admin)
	f := &joinFleet{gw: gw, ns: ns, apiAddr: net.JoinHostPort(ns.HostIP, strconv.Itoa(apiPort)), admin: admin}
	f.pin = integration.GatewayCAPin(t, gw)
	const host = "ns-named"
	dir := t.TempDir()
	startInNS(t, ns, f.joinArgs(t, host, dir)...)
	cs := gw.Client()
	integration.WaitFor(t, 60*time.Second, host+" online", func() bool { return integration.HostOnline(cs, host) })
	id, err := identity.Load(filepath.Join(dir, ".state"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "tls://" + net.JoinHostPort(ns.HostIP, strconv.Itoa(natsPort)); len(id.Enrolment.NATSURLs) != 1 || id.Enrolment.NATSURLs[0] != want {
		t.Errorf("the host stored the NATS URLs %v, want [%s]", id.Enrolment.NATSURLs, want)
	}
}

// TestJoinRefusedBeforeTokenSpent: a gateway whose fleet API other
// machines reach but whose NATS server listens on loopback only would
// hand a remote host tls://127.0.0.1. The join is refused before the
// token is spent, saying what to change on the gateway; the host writes
// no enrolment, and the token enrols it once the gateway is fixed.
func TestJoinRefusedBeforeTokenSpent(t *testing.T) {
	ns := integration.NewNetNS(t)
	admin, tokens := adminTokens(t)
	apiAddr := net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP)))
	loopNATS := fmt.Sprintf("127.0.0.1:%d", integration.FreePort(t))
	gw := integration.LaunchGatewayProcess(t, admin, "--api_tokens", tokens, "--nats_listen", loopNATS, "--nats_tls", "--api_listen", apiAddr)
	f := &joinFleet{gw: gw, ns: ns, apiAddr: apiAddr, pin: integration.GatewayCAPin(t, gw), admin: admin}
	const host = "ns-early"
	dir := t.TempDir()
	args := f.joinArgs(t, host, dir)
	out, err := ns.Command(integration.AgentBinary(t), args...).CombinedOutput()
	if err == nil {
		t.Fatalf("the join succeeded with a loopback NATS URL:\n%s", out)
	}
	for _, want := range []string{"gateway_misconfigured", "tls://" + loopNATS, "Nothing was spent", "--nats_listen 0.0.0.0:", "--advertise NAME"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the refusal lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ".state", identity.Dir, identity.EnrolmentFile)); err == nil {
		t.Error("the refused join stored an enrolment")
	}
	if list := f.fleetctl(t, "token", "list"); !strings.Contains(list, "0/1") || strings.Contains(list, "spent") {
		t.Errorf("the token was spent on a refused join:\n%s", list)
	}

	// Fixed: NATS where the host reaches it. The same token enrols it.
	gw.Stop()
	natsAddr := net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP)))
	gw = integration.LaunchGatewayProcess(t, admin, "--api_tokens", tokens, "--data_dir", gw.DataDir, "--nats_listen", natsAddr, "--api_listen", apiAddr)
	startInNS(t, ns, args...)
	cs := gw.Client()
	integration.WaitFor(t, 60*time.Second, host+" online", func() bool { return integration.HostOnline(cs, host) })
}

// TestJoinStaleNATSURLHeals: a host joined while the gateway's NATS
// server listened at one address; the gateway comes back with another.
// The host's stored URL no longer answers: the agent says which URL and
// why, asks the fleet API for the current URLs with its own key, stores
// them and comes back online without being touched. Revoked afterwards,
// it exits with agent.ExitRevoked and says once how to enrol again.
func TestJoinStaleNATSURLHeals(t *testing.T) {
	ns := integration.NewNetNS(t)
	admin, tokens := adminTokens(t)
	apiAddr := net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP)))
	oldNATS := net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP)))
	gw := integration.LaunchGatewayProcess(t, admin, "--api_tokens", tokens, "--nats_listen", oldNATS, "--api_listen", apiAddr)
	f := &joinFleet{gw: gw, ns: ns, apiAddr: apiAddr, pin: integration.GatewayCAPin(t, gw), admin: admin}
	const host = "ns-moved"
	dir := t.TempDir()
	stateDir := filepath.Join(dir, ".state")
	joined := startInNS(t, ns, f.joinArgs(t, host, dir)...)
	first := gw.Client()
	integration.WaitFor(t, 60*time.Second, host+" online", func() bool { return integration.HostOnline(first, host) })
	joined.stop(t)
	if id, err := identity.Load(stateDir); err != nil || id.Enrolment.NATSURLs[0] != "tls://"+oldNATS {
		t.Fatalf("after the join: %v", err)
	}

	gw.Stop()
	newNATS := net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP)))
	gw = integration.LaunchGatewayProcess(t, admin, "--api_tokens", tokens, "--data_dir", gw.DataDir, "--nats_listen", newNATS, "--api_listen", apiAddr)
	f.gw = gw
	a := startInNS(t, ns, "--state_dir", stateDir, "--cwd", dir, "--heartbeat", "500ms")
	cs := gw.Client()
	integration.WaitFor(t, 90*time.Second, host+" online again", func() bool { return integration.HostOnline(cs, host) })
	log := a.stderr.String()
	for _, want := range []string{"cannot reach NATS at tls://" + oldNATS, "connection refused", "fleet-agent doctor", "the gateway gave other NATS URLs"} {
		if !strings.Contains(log, want) {
			t.Errorf("the agent's log lacks %q:\n%s", want, log)
		}
	}
	id, err := identity.Load(stateDir)
	if err != nil || len(id.Enrolment.NATSURLs) != 1 || id.Enrolment.NATSURLs[0] != "tls://"+newNATS {
		t.Errorf("the stored NATS URLs after the heal: %v (%v), want [tls://%s]", id.Enrolment.NATSURLs, err, newNATS)
	}

	f.fleetctl(t, "agent", "revoke", host)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the revoked agent did not exit\n%s", a.stderr.String())
	}
	if code := a.cmd.ProcessState.ExitCode(); code != agent.ExitRevoked {
		t.Errorf("the revoked agent exited with status %d, want %d", code, agent.ExitRevoked)
	}
	if log := a.stderr.String(); strings.Count(log, "fleetctl token create --replace "+host) != 1 {
		t.Errorf("the revoked agent's log does not say once how to enrol again:\n%s", log)
	}
}
