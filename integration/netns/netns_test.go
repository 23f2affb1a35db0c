//go:build linux

package netns

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/integration"
)

// TestAgentInNetNSOverTLS: a fleet-agent process on a machine of its own
// as far as the network goes (a network namespace that reaches the
// gateway only over a veth link) joins the embedded NATS server, which
// serves TLS from the fleet CA on that link, comes online and runs bash
// there. The same agent trusting a CA that is not the gateway's never
// joins, and says it is a certificate problem.
func TestAgentInNetNSOverTLS(t *testing.T) {
	ns := integration.NewNetNS(t)
	natsAddr := net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP)))
	gw := integration.StartGatewayProcess(t, "--nats_listen", natsAddr)
	caPEM, err := os.ReadFile(filepath.Join(gw.DataDir, "tls", "ca.pem"))
	if err != nil {
		t.Fatalf("the gateway's fleet CA: %v", err)
	}
	natsURL := "tls://" + natsAddr
	cs := gw.Client()

	t.Run("the gateway's CA", func(t *testing.T) {
		const host = "ns-web-1"
		a := startAgentInNS(t, ns, gw, host, natsURL, caPEM)
		integration.WaitFor(t, 30*time.Second, host+" online", func() bool { return integration.HostOnline(cs, host) })
		// The agent runs in the namespace: it sees its end of the link,
		// not the gateway's.
		out := integration.MustOK(t, integration.Call(t, cs, "bash", map[string]any{"host": host, "command": "cat /proc/net/dev; echo from-$(hostname)-ns"}))
		if !strings.Contains(out, ns.NSIf+":") || strings.Contains(out, ns.HostIf+":") || !strings.Contains(out, "-ns") {
			t.Errorf("bash on %s did not run in namespace %s (want %s, not %s):\n%s", host, ns.Name, ns.NSIf, ns.HostIf, out)
		}
		if log := a.stderr.String(); strings.Contains(log, "certificate") {
			t.Errorf("the agent logged a certificate problem:\n%s", log)
		}
	})

	t.Run("another CA", func(t *testing.T) {
		const host = "ns-web-2"
		other, err := os.ReadFile(filepath.Join(integration.LoopbackTLS(t, t.TempDir()), "ca.pem"))
		if err != nil {
			t.Fatal(err)
		}
		a := startAgentInNS(t, ns, gw, host, natsURL, other)
		integration.WaitFor(t, 30*time.Second, "the agent to report the certificate it does not trust", func() bool {
			return strings.Contains(a.stderr.String(), "certificate signed by unknown authority")
		})
		if integration.HostOnline(cs, host) {
			t.Errorf("%s, trusting another CA, is online", host)
		}
	})
}

// startAgentInNS gives host an identity and runs its fleet-agent in ns;
// it stops the agent with the test.
func startAgentInNS(t *testing.T, ns *integration.NetNS, gw *integration.GatewayProc, host, natsURL string, natsCA []byte) *nsProcess {
	t.Helper()
	dir := t.TempDir()
	stateDir := filepath.Join(dir, ".state")
	enrolInNS(t, gw, host, stateDir, natsURL, natsCA)
	return startInNS(t, ns, "--state_dir", stateDir, "--cwd", dir, "--heartbeat", "500ms", "--log_level", "info")
}

// enrolInNS writes host's identity into stateDir the way fleet-agent
// join stores it: a key and a credential the gateway's agent signing key
// issued for it, and the enrolment naming the NATS URL and CA. (When
// join can run against the gateway process, this becomes `ip netns exec
// NS fleet-agent join --gateway https://HOST_IP:PORT --token T --ca_pin
// P` with a token the test makes.)
func enrolInNS(t *testing.T, gw *integration.GatewayProc, host, stateDir, natsURL string, natsCA []byte) {
	t.Helper()
	creds, resp := gw.Enrol(host)
	token, err := creds.JWT()
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(natsCA)
	if block == nil {
		t.Fatal("the NATS CA is not PEM")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	store := identity.Open(stateDir)
	if err = os.MkdirAll(store.Dir(), 0o700); err == nil {
		err = os.WriteFile(filepath.Join(store.Dir(), identity.KeyFile), append(creds.Seed, '\n'), 0o600)
	}
	if err == nil {
		err = store.SaveJWT(token)
	}
	if err == nil {
		err = store.SaveEnrolment(&identity.Enrolment{Host: host, NATSURLs: []string{natsURL}, NATSCA: string(natsCA),
			CAPin: protocol.CAPin(ca), SigningKeys: resp.SigningKeys, SigningKeySerial: resp.SigningKeySerial,
			EnrolledAt: time.Now().UTC(), Expires: time.Now().Add(time.Hour).UTC()})
	}
	if err != nil {
		t.Fatalf("write the identity of %s: %v", host, err)
	}
}

// TestNetNSHarness: namespaces made side by side get their own names and
// addresses, and nothing of them is left once their test ends.
func TestNetNSHarness(t *testing.T) {
	made := make(chan *integration.NetNS, 2)
	t.Run("group", func(t *testing.T) {
		for _, name := range []string{"a", "b"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ns := integration.NewNetNS(t)
				if out, err := ns.Command("ip", "-o", "addr", "show", "dev", ns.NSIf).CombinedOutput(); err != nil || !strings.Contains(string(out), ns.NSIP+"/30") {
					t.Errorf("in %s, %s does not have %s: %v\n%s", ns.Name, ns.NSIf, ns.NSIP, err, out)
				}
				made <- ns
			})
		}
	})
	close(made)
	var all []*integration.NetNS
	for ns := range made {
		all = append(all, ns)
	}
	if len(all) != 2 {
		t.Skip("no namespaces were made")
	}
	if all[0].Name == all[1].Name || all[0].HostIP == all[1].HostIP || all[0].HostIf == all[1].HostIf {
		t.Errorf("two namespaces share a name or an address: %+v %+v", *all[0], *all[1])
	}
	list, _ := exec.Command("ip", "netns", "list").CombinedOutput()
	links, _ := exec.Command("ip", "-o", "link").CombinedOutput()
	for _, ns := range all {
		if strings.Contains(string(list), ns.Name) || strings.Contains(string(links), ns.HostIf) {
			t.Errorf("namespace %s or link %s is left after its test", ns.Name, ns.HostIf)
		}
	}
}
