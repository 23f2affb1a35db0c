package gateway

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"

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
		!strings.Contains(aerr.Message, "Nothing was spent") || !strings.Contains(aerr.Message, "--advertise") {
		t.Errorf("a remote client given a loopback URL: %v", aerr)
	}
	g.cfg.lookupIP = fakeLookup(map[string]string{"gwhost": "10.0.0.5"})
	if aerr := g.checkHandOut(context.Background(), "10.1.2.3"); aerr != nil {
		t.Errorf("a good URL was refused: %v", aerr)
	}
}
