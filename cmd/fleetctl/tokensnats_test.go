package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// token create --nats asks for a NATS join token; without it, none.
func TestTokenCreateNATS(t *testing.T) {
	g := startFakeGateway(t)
	mustRun(t, adminEnv(g), "token", "create", "--nats", "--name", "edge-1")
	var req protocol.TokenCreateRequest
	body(t, g.last(), &req)
	if !req.NATS || req.Name != "edge-1" {
		t.Errorf("token create --nats sent %+v", req)
	}
	g.requests = nil
	mustRun(t, adminEnv(g), "token", "create")
	req = protocol.TokenCreateRequest{}
	body(t, g.last(), &req)
	if req.NATS {
		t.Errorf("token create sent %+v", req)
	}
}

// A NATS join token is shown as one, with the NATS URLs, the command
// which reads the token from standard input.
func TestPrintCreatedNATS(t *testing.T) {
	var out bytes.Buffer
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	c := &cli{stdout: &out, now: func() time.Time { return now }}
	r := &protocol.TokenCreateResponse{Token: "fmcpn1.abc", Info: protocol.TokenInfo{ID: "aaaaaaaaaa", Uses: 1, NATS: true, ExpiresAt: now.Add(time.Hour)},
		CAPin: "sha256:" + strings.Repeat("1", 64), NATSURLs: []string{"tls://gw.example:4222"},
	}
	r.JoinCommand, r.InstallCommand = protocol.JoinCommands(r)
	c.printCreated(r)
	for _, want := range []string{"NATS join token", "fmcpn1.abc", "tls://gw.example:4222", r.JoinCommand, "--token_file -", "standard input"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("token create --nats prints no %q:\n%s", want, out.String())
		}
	}
}
