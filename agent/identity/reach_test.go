package identity

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/identity/identitytest"
)

// closedPort returns a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// natsGreeter serves the start of a NATS connection: the INFO line, then a
// TLS handshake with cert (none: plain).
func natsGreeter(t *testing.T, cert *tls.Certificate) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write([]byte("INFO {\"tls_required\":true}\r\n")); err != nil || cert == nil {
					return
				}
				tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{*cert}})
				_ = tc.Handshake()
			})
		}
	})
	return ln.Addr().String()
}

// A join that cannot reach the fleet API says where it dialled, what the
// name resolved to and what to check, not a bare dial error.
func TestJoinUnreachableExplained(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	o := opts(g, t.TempDir())
	o.GatewayURL = "https://" + closedPort(t)
	_, _, err := Join(context.Background(), o)
	var uerr *UnreachableError
	if !errors.As(err, &uerr) {
		t.Fatalf("Join to a closed port: %v, not an *UnreachableError", err)
	}
	for _, want := range []string{"the fleet API is not reachable at " + o.GatewayURL, "resolved to 127.0.0.1", "connection refused", "--api_listen", "--advertise", "firewalls"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q: %v", want, err)
		}
	}
}

func TestProbeNATS(t *testing.T) {
	ca, other := identitytest.NewCA(t, "fleet"), identitytest.NewCA(t, "other")
	leaf := ca.Leaf(t, []string{"127.0.0.1"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	good := natsGreeter(t, &leaf)
	closed := closedPort(t)
	ctx := context.Background()
	if err := ProbeNATS(ctx, []string{"tls://" + good}, ca.PEM()); err != nil {
		t.Errorf("a server of the CA: %v", err)
	}
	if err := ProbeNATS(ctx, []string{"tls://" + closed, "tls://" + good}, ca.PEM()); err != nil {
		t.Errorf("one URL of two works: %v", err)
	}
	err := ProbeNATS(ctx, []string{"tls://" + closed}, ca.PEM())
	if err == nil || !strings.Contains(err.Error(), "NATS is not reachable at tls://"+closed) || !strings.Contains(err.Error(), "connection refused") ||
		!strings.Contains(err.Error(), "--advertise") {
		t.Errorf("a closed port: %v", err)
	}
	err = ProbeNATS(ctx, []string{"tls://" + good}, other.PEM())
	if err == nil || !strings.Contains(err.Error(), "does not verify against the fleet's NATS CA") {
		t.Errorf("a server of another CA: %v", err)
	}
	err = ProbeNATS(ctx, []string{"tls://localhost:" + strings.Split(good, ":")[1]}, ca.PEM())
	if err == nil || !strings.Contains(err.Error(), `not valid for "localhost"`) {
		t.Errorf("a name the certificate lacks: %v", err)
	}
	if err := ProbeNATS(ctx, []string{"nats://" + natsGreeter(t, nil)}, ""); err != nil {
		t.Errorf("a plain server: %v", err)
	}
}

// An enrolled host asks for its NATS URLs with its key, and stores them
// when they changed.
func TestLocate(t *testing.T) {
	g := identitytest.NewGateway(t, identitytest.NewCA(t, "fleet"))
	state := t.TempDir()
	id, _, err := Join(context.Background(), opts(g, state))
	if err != nil {
		t.Fatal(err)
	}
	urls, changed, err := id.Locate(context.Background())
	if err != nil || changed || len(urls) != 1 || urls[0] != g.NATSURLs[0] {
		t.Fatalf("Locate with the URLs unchanged: %v %v %v", urls, changed, err)
	}
	g.SetNATSURLs([]string{"tls://10.9.9.9:4222"})
	urls, changed, err = id.Locate(context.Background())
	if err != nil || !changed || len(urls) != 1 || urls[0] != "tls://10.9.9.9:4222" {
		t.Fatalf("Locate with new URLs: %v %v %v", urls, changed, err)
	}
	again, err := Load(state)
	if err != nil || len(again.Enrolment.NATSURLs) != 1 || again.Enrolment.NATSURLs[0] != "tls://10.9.9.9:4222" {
		t.Fatalf("the new URLs are not stored: %v %v", again.Enrolment.NATSURLs, err)
	}
	// Another key is refused.
	other := t.TempDir()
	o := opts(g, other)
	o.Host = "web-2"
	id2, _, err := Join(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	id2.Enrolment.Host = "web-1"
	var rerr *RefusedError
	if _, _, err := id2.Locate(context.Background()); !errors.As(err, &rerr) {
		t.Errorf("Locate with another host's name: %v", err)
	}
}

// A join over NATS that cannot reach the server says where and why.
func TestJoinOverNATSUnreachableExplained(t *testing.T) {
	addr := closedPort(t)
	_, _, err := Join(context.Background(), JoinOptions{NATSURL: "tls://" + addr, Token: testNATSToken(t),
		CAPin: identitytest.NewCA(t, "fleet").Pin(), StateDir: t.TempDir(), Host: "edge-1"})
	var uerr *UnreachableError
	if !errors.As(err, &uerr) || !strings.Contains(err.Error(), "the gateway's NATS server is not reachable at tls://"+addr) ||
		!strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "--nats_listen") {
		t.Errorf("join over NATS to a closed port: %v", err)
	}
}
