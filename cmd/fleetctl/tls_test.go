package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestTLSRefusedBeforeTheToken: a gateway whose certificate does not
// check out is refused during the handshake, so the admin token is never
// sent; each refusal says what to check.
func TestTLSRefusedBeforeTheToken(t *testing.T) {
	ca := newTestCA(t, "fleet CA")
	other := newTestCA(t, "other CA")
	for _, tc := range []struct {
		name  string
		ca    *testCA // the gateway's
		names []string
		env   func(g *fakeGateway) map[string]string
		want  []string
	}{
		{"another CA's pin", ca, []string{"127.0.0.1"}, func(g *fakeGateway) map[string]string {
			e := adminEnv(g)
			e["FLEET_CA_PIN"] = other.pin
			return e
		}, []string{"refused the gateway", ca.pin, `"fleet CA"`, other.pin, "--ca_pin"}},
		{"pinned CA, certificate for another host", ca, []string{"gateway.example.com"}, adminEnv,
			[]string{"not valid for", "127.0.0.1", "--advertise"}},
		{"another CA in --ca_file", ca, []string{"127.0.0.1"}, func(g *fakeGateway) map[string]string {
			return map[string]string{"FLEET_GATEWAY": g.url(), "FLEET_API_TOKEN": adminToken}
		}, []string{"not signed by the CA of", "--ca_pin"}},
		{"system roots", ca, []string{"127.0.0.1"}, func(g *fakeGateway) map[string]string {
			return map[string]string{"FLEET_GATEWAY": g.url(), "FLEET_API_TOKEN": adminToken}
		}, []string{"not signed by the system's trusted CAs", "--ca_pin"}},
		// The pinned CA's certificate in the chain proves nothing: the
		// leaf must be signed by it.
		{"the pinned CA in the chain, the leaf signed by another", ca, nil, adminEnv,
			[]string{"not signed by the CA with pin " + ca.pin}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cert := tc.ca.serverCert(t, tc.names...)
			if tc.names == nil {
				cert = other.serverCert(t, "127.0.0.1")
				cert.Certificate[1] = ca.cert.Raw
			}
			g := startFakeGatewayWith(t, tc.ca, cert)
			env := tc.env(g)
			args := []string{"agent", "list"}
			if strings.Contains(tc.name, "--ca_file") {
				args = append(args, "--ca_file", other.pemFile(t))
			}
			r := fleetctl(t, env, args...)
			if r.code != 1 {
				t.Fatalf("exit %d (%q); want 1", r.code, r.stderr)
			}
			t.Logf("%s", r.stderr)
			contains(t, "the refusal", r.stderr, tc.want...)
			if n := len(g.sent()); n != 0 {
				t.Errorf("the gateway got %d requests, the admin token with them", n)
			}
		})
	}
}

// TestTLSTrusted: the pinned CA, a --ca_file with the gateway's CA, a
// name the certificate holds (localhost) all work.
func TestTLSTrusted(t *testing.T) {
	g := startFakeGateway(t)
	mustRun(t, adminEnv(g), "agent", "list")
	env := map[string]string{"FLEET_GATEWAY": g.url(), "FLEET_API_TOKEN": adminToken}
	mustRun(t, env, "agent", "list", "--ca_file", g.ca.pemFile(t))
	_, port, _ := net.SplitHostPort(g.srv.Listener.Addr().String())
	env["FLEET_GATEWAY"] = "https://localhost:" + port
	env["FLEET_CA_PIN"] = g.ca.pin
	mustRun(t, env, "agent", "list")
	if n := len(g.sent()); n != 3 {
		t.Errorf("the gateway got %d requests; want 3", n)
	}
}

// TestConnectionErrors: a gateway that cannot be reached, or that does
// not speak TLS, is explained.
func TestConnectionErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	pin := newTestCA(t, "x").pin
	r := fleetctl(t, map[string]string{"FLEET_GATEWAY": "https://" + addr, "FLEET_CA_PIN": pin}, "agent", "list")
	if r.code != 1 {
		t.Fatalf("exit %d; want 1", r.code)
	}
	contains(t, "a closed port", r.stderr, "cannot reach the gateway at "+addr, "--api_listen")

	// A plain HTTP server where the fleet API should be.
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	go func() {
		for {
			c, err := plain.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 1024)
			_, _ = c.Read(buf)
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			c.Close()
		}
	}()
	r = fleetctl(t, map[string]string{"FLEET_GATEWAY": "https://" + plain.Addr().String(), "FLEET_CA_PIN": pin}, "agent", "list")
	contains(t, "a plain HTTP server", r.stderr, "does not speak TLS")
}

// TestSettings: the environment gives the gateway, token and pin; flags
// override it; bad settings are refused with what to do.
func TestSettings(t *testing.T) {
	g := startFakeGateway(t)
	other := startFakeGateway(t)

	// Flags win over the environment, before or after the command.
	env := adminEnv(other)
	env["FLEET_API_TOKEN"] = "fmcp_wrong"
	mustRun(t, env, "--gateway", g.url(), "--ca_pin", g.ca.pin, "agent", "list", "--api_token", adminToken)
	if len(other.sent()) != 0 {
		t.Error("the gateway of FLEET_GATEWAY was asked, not the one of --gateway")
	}
	checkRequest(t, g.last(), "GET", protocol.AdminAgentsPath)

	// The token from a file.
	g.requests = nil
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mustRun(t, map[string]string{"FLEET_GATEWAY": g.url(), "FLEET_CA_PIN": g.ca.pin}, "token", "list", "--api_token_file", file)
	checkRequest(t, g.last(), "GET", protocol.AdminTokensPath)

	// No token at all: no Authorization header (a gateway without
	// authentication takes the local caller as admin).
	g.requests = nil
	r := fleetctl(t, map[string]string{"FLEET_GATEWAY": g.url(), "FLEET_CA_PIN": g.ca.pin}, "token", "list")
	if got := g.last().Auth; got != "" || r.code != 1 {
		t.Errorf("without a token fleetctl sent Authorization %q (exit %d)", got, r.code)
	}

	g.requests = nil
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{}, nil, "no gateway"},
		{map[string]string{"FLEET_GATEWAY": "http://" + g.srv.Listener.Addr().String()}, nil, "HTTPS only"},
		{map[string]string{"FLEET_GATEWAY": "gw:8443"}, nil, "want https://"},
		{map[string]string{"FLEET_GATEWAY": "https://admin:pw@gw:8443"}, nil, "without user"},
		{map[string]string{"FLEET_GATEWAY": g.url(), "FLEET_CA_PIN": "sha256:abc"}, nil, "not a CA pin"},
		{map[string]string{"FLEET_GATEWAY": g.url(), "FLEET_CA_PIN": g.ca.pin}, []string{"--ca_file", g.ca.pemFile(t)}, "both given"},
		{map[string]string{"FLEET_GATEWAY": g.url(), "FLEET_API_TOKEN": "x"}, []string{"--api_token_file", file}, "both given"},
		{map[string]string{"FLEET_GATEWAY": g.url()}, []string{"--api_token_file", filepath.Join(t.TempDir(), "none")}, "--api_token_file"},
		{map[string]string{"FLEET_GATEWAY": g.url()}, []string{"--ca_file", file}, "no PEM certificate"},
		{map[string]string{"FLEET_GATEWAY": g.url()}, []string{"--timeout", "0s"}, "--timeout"},
	} {
		r := fleetctl(t, tc.env, append([]string{"agent", "list"}, tc.args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("env %v, flags %v: exit %d, %q; want it to say %q", tc.env, tc.args, r.code, r.stderr, tc.want)
		}
	}
	if n := len(g.sent()); n != 0 {
		t.Errorf("fleetctl sent %d requests with settings it refused", n)
	}
}

// TestUsage: help for fleetctl, a group and each command; unknown
// commands and flags are usage errors (exit 2).
func TestUsage(t *testing.T) {
	r := mustRun(t, nil, "help")
	for _, cmd := range commands {
		contains(t, "fleetctl help", r.stderr, cmd.path())
	}
	contains(t, "fleetctl help", r.stderr, "FLEET_GATEWAY", "FLEET_API_TOKEN", "FLEET_CA_PIN", "--ca_file", "--json", "--timeout")
	for _, cmd := range commands {
		for _, args := range [][]string{{cmd.group, cmd.name, "-h"}, {"help", cmd.group, cmd.name}} {
			r := fleetctl(t, nil, args...)
			if r.code != 0 || !strings.Contains(r.stderr, "Usage: fleetctl "+cmd.path()) {
				t.Errorf("fleetctl %v: exit %d\n%s", args, r.code, r.stderr)
			}
		}
	}
	contains(t, "token create -h", fleetctl(t, nil, "token", "create", "-h").stderr, "--labels", "--ttl", "--uses", "--name_pattern", "--replace")
	contains(t, "allow-recovery -h", fleetctl(t, nil, "agent", "allow-recovery", "-h").stderr, "--count")
	for _, args := range [][]string{{}, {"nosuch"}, {"token"}, {"token", "nosuch"}, {"agent", "list", "--nosuch"}, {"help", "nosuch"}} {
		if r := fleetctl(t, nil, args...); r.code != 2 {
			t.Errorf("fleetctl %v: exit %d; want 2\n%s", args, r.code, r.stderr)
		}
	}
}
