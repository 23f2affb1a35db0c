package identity

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/identity/identitytest"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// fakeNATS is a NATS server's opening as far as the client's CONNECT: it
// sends INFO asking for TLS, does the handshake with cert, and records
// what the client sent after it.
type fakeNATS struct {
	ln   net.Listener
	mu   sync.Mutex
	sent []string
	wg   sync.WaitGroup
}

func startFakeNATS(t *testing.T, cert tls.Certificate) *fakeNATS {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeNATS{ln: ln}
	f.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Go(func() { f.serve(c, cert) })
		}
	})
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fakeNATS) serve(c net.Conn, cert tls.Certificate) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(`INFO {"server_id":"fake","version":"2.11.0","proto":1,"tls_required":true,"max_payload":1048576,"nonce":"abc"}` + "\r\n")); err != nil {
		return
	}
	tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err := tc.Handshake(); err != nil {
		return
	}
	line, _ := bufio.NewReader(tc).ReadString('\n')
	f.mu.Lock()
	f.sent = append(f.sent, line)
	f.mu.Unlock()
}

func (f *fakeNATS) received() []string {
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sent
}

// testNATSToken returns a NATS join token with a real (unsigned by any
// fleet) credential.
func testNATSToken(t *testing.T) string {
	t.Helper()
	_, _, token := protocol.NewJoinToken()
	kp, _ := nkeys.CreateUser()
	acc, _ := nkeys.CreateAccount()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	cred, err := jwt.NewUserClaims(pub).Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	nt := protocol.NATSJoinToken{Token: token, JWT: cred, Seed: string(seed)}
	return nt.Encode()
}

// A join over NATS checks the server's certificate against the pin, the
// host name and the validity, as a join over HTTPS does, before it sends
// anything: no CONNECT (which carries the credential), no request (which
// carries the token) reaches a server that fails. One that passes gets
// the CONNECT.
func TestJoinOverNATSPinsTheCA(t *testing.T) {
	fleet := identitytest.NewCA(t, "fleet")
	other := identitytest.NewCA(t, "other")
	now := time.Now()
	good := []string{"127.0.0.1", "localhost"}
	for _, tc := range []struct {
		name string
		cert tls.Certificate
		want string // "" passes
	}{
		{"another CA", other.Leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), other.Cert), "holds no CA certificate of the pin"},
		{"another CA presenting the fleet's", other.Leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), fleet.Cert), "does not verify"},
		{"another host name", fleet.Leaf(t, []string{"gw.example"}, now.Add(-time.Hour), now.Add(time.Hour), fleet.Cert), "does not verify"},
		{"expired", fleet.Leaf(t, good, now.Add(-2*time.Hour), now.Add(-time.Hour), fleet.Cert), "expired"},
		{"the fleet's", fleet.Leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), fleet.Cert), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startFakeNATS(t, tc.cert)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			_, _, err := Join(ctx, JoinOptions{NATSURL: "tls://" + srv.ln.Addr().String(), Token: testNATSToken(t), CAPin: fleet.Pin(),
				StateDir: t.TempDir(), Host: "edge-1"})
			if err == nil {
				t.Fatal("the join went through against a fake server")
			}
			srv.ln.Close()
			sent := srv.received()
			if tc.want == "" {
				if len(sent) == 0 || !strings.HasPrefix(sent[0], "CONNECT ") || !strings.Contains(sent[0], `"jwt"`) {
					t.Fatalf("a server with the pinned CA got %q (err %v)", sent, err)
				}
				return
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("join: %v; want %q", err, tc.want)
			}
			if len(sent) != 0 {
				t.Errorf("the server that failed the pin got %q", sent)
			}
		})
	}
}

// Enrolment over NATS takes a tls:// URL of one server and a NATS join
// token, and not --gateway as well; a NATS join token is refused for a
// join over HTTPS with advice.
func TestJoinOverNATSRefusesBadOptions(t *testing.T) {
	pin := "sha256:" + strings.Repeat("a", 64)
	nt := testNATSToken(t)
	_, _, plain := protocol.NewJoinToken()
	for _, tc := range []struct {
		o    JoinOptions
		want string
	}{
		{JoinOptions{NATSURL: "nats://gw:4222", Token: nt, CAPin: pin}, "not tls://"},
		{JoinOptions{NATSURL: "tls://gw", Token: nt, CAPin: pin}, "no host or port"},
		{JoinOptions{NATSURL: "tls://a:4222,tls://b:4222", Token: nt, CAPin: pin}, "one server"},
		{JoinOptions{NATSURL: "tls://u:p@gw:4222", Token: nt, CAPin: pin}, "user name or password"},
		{JoinOptions{NATSURL: "tls://gw:4222", Token: plain, CAPin: pin}, "not a NATS join token"},
		{JoinOptions{NATSURL: "tls://gw:4222", GatewayURL: "https://gw:8443", Token: nt, CAPin: pin}, "both given"},
		{JoinOptions{GatewayURL: "https://gw:8443", Token: nt, CAPin: pin}, "--nats tls://HOST:PORT"},
		{JoinOptions{NATSURL: "tls://gw:4222", Token: nt[:len(nt)-8], CAPin: pin}, "NATS join token"},
	} {
		err := CheckJoinOptions(&tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want %q", tc.o, err, tc.want)
		}
	}
	if err := CheckJoinOptions(&JoinOptions{NATSURL: "tls://gw.example:4222", Token: nt, CAPin: pin}); err != nil {
		t.Errorf("good options refused: %v", err)
	}
}
