package integration

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestEmbeddedNATSServesTLS: with --nats_tls the embedded server speaks
// TLS with a certificate from the fleet CA on loopback: agents that trust
// the CA (the enrolment gives it to them) join, a client trusting another
// CA is refused, and so is a plain connection.
func TestEmbeddedNATSServesTLS(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}, Gateway: func(c *gateway.Config) { c.NATSTLS = true }})
	checkTLS(t, env, env.NATSURL())
}

// TestEmbeddedNATSTLSBeyondLoopback: on an address other machines reach,
// the embedded server serves TLS only, without being asked, and agents
// are told a tls:// URL.
func TestEmbeddedNATSTLSBeyondLoopback(t *testing.T) {
	ip := nonLoopbackIPv4()
	if ip == "" {
		t.Skip("this machine has no non-loopback IPv4 address")
	}
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.NATSListen = net.JoinHostPort(ip, "0") }})
	urls := env.Gateway.AgentNATSURLs()
	if len(urls) != 1 || !strings.HasPrefix(urls[0], "tls://"+ip+":") {
		t.Fatalf("agents are told %v; want tls://%s:PORT", urls, ip)
	}
	env.StartAgent("alpha", nil)
	env.WaitHost("alpha", true)
	checkTLS(t, env, urls[0])
}

// checkTLS checks the embedded server at natsURL (tls://) with the
// in-process agent alpha online.
func checkTLS(t *testing.T, env *Env, natsURL string) {
	t.Helper()
	u, err := url.Parse(natsURL)
	if err != nil || u.Scheme != "tls" {
		t.Fatalf("the embedded server's URL is %q; want tls://", natsURL)
	}
	creds, seed := env.Enrol("alpha")
	block, _ := pem.Decode(creds.CAPEM)
	if block == nil {
		t.Fatal("the enrolment gave no CA")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if pin := protocol.CAPin(ca); pin != creds.CAPin || pin != env.Gateway.NATSCAPin() {
		t.Errorf("CA pins differ: of the CA %s, enrolment %s, gateway %s", pin, creds.CAPin, env.Gateway.NATSCAPin())
	}
	login := nats.UserJWTAndSeed(creds.JWT, string(seed))
	nc, err := nats.Connect(natsURL, login, agentTLS(creds.CAPEM))
	if err != nil {
		t.Fatalf("with the fleet CA: %v", err)
	}
	if !nc.TLSRequired() {
		t.Error("the connection is not TLS")
	}
	nc.Close()

	other := testTLS(t, t.TempDir())
	otherCA, _ := os.ReadFile(filepath.Join(other, "ca.pem"))
	if nc, err := nats.Connect(natsURL, login, agentTLS(otherCA)); err == nil {
		nc.Close()
		t.Error("a client trusting another CA connected")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("with another CA: %v; want a certificate error", err)
	}
	plain := "nats://" + u.Host
	if nc, err := nats.Connect(plain, login); err == nil {
		nc.Close()
		t.Error("a plain connection was admitted")
	}
	h, ok := env.Gateway.Host("alpha")
	if !ok || !h.Online {
		t.Error("alpha, an agent with the fleet CA, is not online")
	}
}

func nonLoopbackIPv4() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}
