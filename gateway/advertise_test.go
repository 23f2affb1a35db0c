package gateway

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// fakeLookup resolves names from a table; others do not resolve.
func fakeLookup(names map[string]string) ipLookup {
	return func(_ context.Context, host string) ([]net.IPAddr, error) {
		ip, ok := names[host]
		if !ok {
			return nil, errors.New("no such host")
		}
		return []net.IPAddr{{IP: net.ParseIP(ip)}}, nil
	}
}

func TestCheckAdvertised(t *testing.T) {
	hostname, _ := os.Hostname()
	lookup := fakeLookup(map[string]string{hostname: "127.0.1.1", "gw.lan": "10.0.0.5", "self.lan": "127.0.0.1"})
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string // nil: accepted
	}{
		{"loopback listeners", Config{APIListen: "127.0.0.1:8443", NATSListen: "127.0.0.1:4222"}, nil},
		{"API on every interface, hostname to loopback", Config{APIListen: "0.0.0.0:8443"},
			[]string{"fleet API", "https://" + net.JoinHostPort(hostname, "8443"), "127.0.1.1", "--advertise NAME"}},
		{"NATS on every interface, hostname to loopback", Config{APIListen: "127.0.0.1:8443", NATSListen: "0.0.0.0:4222"},
			[]string{"tls://" + net.JoinHostPort(hostname, "4222"), "127.0.1.1", "--advertise NAME", "stay offline"}},
		{"--advertise fixes both", Config{APIListen: "0.0.0.0:8443", NATSListen: "0.0.0.0:4222", Advertise: []string{"gw.lan"}}, nil},
		{"--advertise to loopback", Config{APIListen: "0.0.0.0:8443", Advertise: []string{"self.lan"}}, []string{"self.lan resolves to 127.0.0.1"}},
		{"--nats_advertise to loopback", Config{NATSListen: "0.0.0.0:4222", Advertise: []string{"gw.lan"}, NATSAdvertise: []string{"tls://localhost:4222"}},
			[]string{"tls://localhost:4222", "--nats_advertise"}},
		{"an address", Config{APIListen: "10.0.0.5:8443", NATSListen: "10.0.0.5:4222"}, nil},
		{"a name that does not resolve here", Config{APIListen: "0.0.0.0:8443", Advertise: []string{"elsewhere.example"}}, nil},
		{"external cluster", Config{NATSURLs: []string{"tls://localhost:4222"}, NATSListen: "0.0.0.0:4222"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.checkAdvertised(context.Background(), lookup)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
		})
	}
}

func TestCheckHandOut(t *testing.T) {
	g := &Gateway{cfg: Config{NATSAdvertise: []string{"tls://gwhost:4222"}, lookupIP: fakeLookup(map[string]string{"gwhost": "127.0.1.1"})}}
	if aerr := g.checkHandOut(context.Background(), "127.0.0.1"); aerr != nil {
		t.Errorf("a loopback client was refused: %v", aerr)
	}
	aerr := g.checkHandOut(context.Background(), "10.1.2.3")
	if aerr == nil || aerr.Code != protocol.APIGatewayMisconfigured || !strings.Contains(aerr.Message, "tls://gwhost:4222") ||
		!strings.Contains(aerr.Message, "Nothing was spent") || !strings.Contains(aerr.Message, "--nats_advertise tls://NAME:PORT") {
		t.Errorf("a remote client given a loopback URL: %v", aerr)
	}
	ext := &Gateway{cfg: Config{NATSURLs: []string{"tls://localhost:4222"}, lookupIP: fakeLookup(nil)}}
	if aerr := ext.checkHandOut(context.Background(), "10.1.2.3"); aerr == nil || !strings.Contains(aerr.Message, "the gateway's own --nats_url") {
		t.Errorf("an external cluster's loopback URL: %v", aerr)
	}
	g.cfg.lookupIP = fakeLookup(map[string]string{"gwhost": "10.0.0.5"})
	if aerr := g.checkHandOut(context.Background(), "10.1.2.3"); aerr != nil {
		t.Errorf("a good URL was refused: %v", aerr)
	}
}

// A host asks for its current NATS URLs with its enrolled key: answered
// without a recovery allowed, refused for another key, an unknown or a
// revoked host.
func TestLocate(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{Uses: 5})
	kp := newUser(t)
	if _, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, time.Now())); code != "" {
		t.Fatal(code)
	}
	locate := func(kp nkeys.KeyPair, host string) (protocol.LocateResponse, protocol.APICode) {
		r := &protocol.LocateRequest{Host: host, CAPin: c.pin}
		signProof(t, kp, &r.Proof, time.Now(), r.SigningBytes)
		var resp protocol.LocateResponse
		if _, aerr := c.do(http.MethodPost, protocol.LocatePath, r, &resp); aerr != nil {
			return resp, aerr.Code
		}
		return resp, ""
	}
	resp, code := locate(kp, "web-1")
	if code != "" || resp.Host != "web-1" || !slices.Equal(resp.NATSURLs, gw.AgentNATSURLs()) || len(resp.NATSURLs) == 0 {
		t.Fatalf("locate: %q %+v (the gateway gives %v)", code, resp, gw.AgentNATSURLs())
	}
	if _, code := locate(newUser(t), "web-1"); code != protocol.APIForbidden {
		t.Errorf("another key: %q", code)
	}
	if _, code := locate(kp, "nobody"); code != protocol.APIUnknownHost {
		t.Errorf("unknown host: %q", code)
	}
	if err := gw.RevokeAgent(context.Background(), "web-1", "test"); err != nil {
		t.Fatal(err)
	}
	if _, code := locate(kp, "web-1"); code != protocol.APIHostRevoked {
		t.Errorf("revoked host: %q", code)
	}
}
