package integration

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/agent/identity"
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

// TestEmbeddedNATSOperatorCertificate: with --nats_tls_cert and
// --nats_tls_key the embedded server serves the operator's chain; agents
// get the chain's CA and trust nothing else, and a host joins over NATS
// pinning that CA (the pin a NATS join token carries).
func TestEmbeddedNATSOperatorCertificate(t *testing.T) {
	tlsDir := testTLS(t, t.TempDir())
	server, _ := os.ReadFile(filepath.Join(tlsDir, "server.pem"))
	caPEM, _ := os.ReadFile(filepath.Join(tlsDir, "ca.pem"))
	chain := filepath.Join(tlsDir, "chain.pem")
	writeFile(t, chain, string(server)+string(caPEM))
	env := NewEnv(t, Options{Agents: []string{"alpha"}, Gateway: func(c *gateway.Config) {
		c.NATSTLSCert, c.NATSTLSKey = chain, filepath.Join(tlsDir, "server-key.pem")
	}})
	if got := env.Gateway.NATSCAPEM(); string(got) != string(caPEM) {
		t.Fatalf("agents get the CA %q, want the chain's", got)
	}
	checkTLS(t, env, env.NATSURL())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok, err := env.Gateway.CreateJoinToken(ctx, &protocol.TokenCreateRequest{Name: "edge-1", NATS: true}, "test")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caPEM)
	ca, _ := x509.ParseCertificate(block.Bytes)
	if tok.CAPin != protocol.CAPin(ca) {
		t.Fatalf("the NATS join token pins %s, the chain's CA is %s", tok.CAPin, protocol.CAPin(ca))
	}
	id, _, err := identity.Join(ctx, identity.JoinOptions{NATSURL: env.NATSURL(), Token: tok.Token, CAPin: tok.CAPin, StateDir: filepath.Join(t.TempDir(), "state")})
	if err != nil {
		t.Fatalf("join over NATS pinning the operator's CA: %v", err)
	}
	if id.Enrolment.NATSCA != string(caPEM) || id.Enrolment.CAPin != tok.CAPin {
		t.Errorf("the enrolment keeps CA %q, pin %s", id.Enrolment.NATSCA, id.Enrolment.CAPin)
	}
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
