package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// connectAgent connects to gw's NATS server with a user JWT and seed, and
// the agent's inbox prefix, trusting caPEM (when given) alone.
func connectAgent(t *testing.T, gw *Gateway, host, userJWT string, seed, caPEM []byte) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.UserJWTAndSeed(userJWT, string(seed)), nats.CustomInboxPrefix(protocol.AgentInboxPrefix(host)),
		nats.MaxReconnects(0)}
	if len(caPEM) > 0 {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		opts = append(opts, nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	nc, err := nats.Connect(gw.NATSURL(), opts...)
	if err != nil {
		t.Fatalf("connect as %s: %v", host, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func renewReq(t *testing.T, kp nkeys.KeyPair, host string, at time.Time) []byte {
	t.Helper()
	r := &protocol.RenewRequest{Host: host}
	signProof(t, kp, &r.Proof, at, r.SigningBytes)
	data, _ := json.Marshal(r)
	return data
}

// renewAnswer decodes a renewal answer: a RenewResponse, or the code of
// an APIError.
func renewAnswer(t *testing.T, m *nats.Msg) (protocol.RenewResponse, protocol.APICode) {
	t.Helper()
	var probe struct {
		Code protocol.APICode `json:"code"`
	}
	if err := json.Unmarshal(m.Data, &probe); err != nil {
		t.Fatalf("answer %q: %v", m.Data, err)
	}
	if probe.Code != "" {
		return protocol.RenewResponse{}, probe.Code
	}
	var resp protocol.RenewResponse
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		t.Fatal(err)
	}
	return resp, ""
}

// An agent renews its credential over its own NATS connection: its
// permissions let it ask on its host's renewal subject and get the
// answer on its inbox; the new JWT is for its key and name, later than
// the first, and the record's expiry follows. Another host's subject is
// not its to publish on; another key, a request for another host, a
// replay and a revoked host are refused.
func TestRenewOverNATS(t *testing.T) {
	clock := &testClock{t: time.Now()}
	gw := startAPIGateway(t, clock, nil)
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{Uses: 5})
	kp := newUser(t)
	first, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, time.Now()))
	if code != "" {
		t.Fatal(code)
	}
	other := newUser(t)
	if _, code := c.enrol(enrolReq(t, other, tok.Token, "web-2", c.pin, time.Now())); code != "" {
		t.Fatal(code)
	}
	nc := agentConn(t, gw, "web-1", kp, first)
	tap := tapAudit(t, gw)

	// Past half the credential's life (the default 720 h): due.
	halfLife := 361 * time.Hour
	clock.advance(halfLife)
	m, err := nc.Request(protocol.RenewSubject("web-1"), renewReq(t, kp, "web-1", clock.now()), 10*time.Second)
	if err != nil {
		t.Fatalf("renew over the agent's own connection: %v", err)
	}
	resp, code := renewAnswer(t, m)
	if code != "" {
		t.Fatalf("renewal refused: %s", code)
	}
	claims, err := jwt.DecodeUserClaims(resp.JWT)
	pub, _ := kp.PublicKey()
	if err != nil || claims.Subject != pub || claims.Name != "web-1" || !resp.Expires.After(first.Expires) || claims.Expires != resp.Expires.Unix() {
		t.Fatalf("renewed JWT %+v (%v), expires %s after %s", claims, err, resp.Expires, first.Expires)
	}
	rec, _ := gw.Agent(context.Background(), "web-1")
	if !rec.CredentialExpiresAt.Equal(resp.Expires) {
		t.Errorf("record expiry %s, want %s", rec.CredentialExpiresAt, resp.Expires)
	}
	// The renewed credential connects.
	seed, _ := kp.Seed()
	connectAgent(t, gw, "web-1", resp.JWT, seed, nil)

	// A renewal of the fresh credential is too early, and changes
	// nothing (nor, with the clock back, would it shorten it).
	clock.advance(-2 * time.Hour)
	if m, err := nc.Request(protocol.RenewSubject("web-1"), renewReq(t, kp, "web-1", clock.now()), 10*time.Second); err != nil {
		t.Fatal(err)
	} else if _, code := renewAnswer(t, m); code != protocol.APITooEarly {
		t.Fatalf("a renewal right after one: %q, want %q", code, protocol.APITooEarly)
	}
	clock.advance(2 * time.Hour)
	if rec, _ := gw.Agent(context.Background(), "web-1"); !rec.CredentialExpiresAt.Equal(resp.Expires) {
		t.Errorf("record expiry went down to %s from %s", rec.CredentialExpiresAt, resp.Expires)
	}
	// From here on web-1 is due again; each refused request below takes
	// one of the host's renewals, which refill one per 15 minutes.
	clock.advance(halfLife)

	t.Run("another host's subject", func(t *testing.T) {
		errs := make(chan error, 4)
		nc2 := connectAgent(t, gw, "web-1", resp.JWT, seed, nil)
		nc2.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
		before, _ := gw.Agent(context.Background(), "web-2")
		_, err := nc2.Request(protocol.RenewSubject("web-2"), renewReq(t, kp, "web-2", clock.now()), 2*time.Second)
		if err == nil {
			t.Fatal("the agent of web-1 got an answer on web-2's renewal subject")
		}
		select {
		case perr := <-errs:
			if !strings.Contains(strings.ToLower(perr.Error()), "permissions violation") {
				t.Errorf("error %v, want a permissions violation", perr)
			}
		case <-time.After(5 * time.Second):
			t.Error("no permissions violation reported")
		}
		if after, _ := gw.Agent(context.Background(), "web-2"); !after.CredentialExpiresAt.Equal(before.CredentialExpiresAt) {
			t.Error("web-2's record changed")
		}
	})
	for _, tc := range []struct {
		name string
		data func() []byte
		want protocol.APICode
	}{
		{"another key", func() []byte { return renewReq(t, other, "web-1", clock.now()) }, protocol.APIForbidden},
		{"another host in the request", func() []byte { return renewReq(t, kp, "web-2", clock.now()) }, protocol.APIBadRequest},
		{"clock skew", func() []byte { return renewReq(t, kp, "web-1", clock.now().Add(-time.Hour)) }, protocol.APIClockSkew},
		{"not JSON", func() []byte { return []byte("renew please") }, protocol.APIBadRequest},
		{"unknown field", func() []byte { return []byte(`{"host":"web-1","admin":true}`) }, protocol.APIBadRequest},
		{"bad signature", func() []byte {
			var r protocol.RenewRequest
			_ = json.Unmarshal(renewReq(t, kp, "web-1", clock.now()), &r)
			r.Nonce = protocol.NewNonce()
			data, _ := json.Marshal(r)
			return data
		}, protocol.APIBadSignature},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock.advance(16 * time.Minute)
			m, err := nc.Request(protocol.RenewSubject("web-1"), tc.data(), 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, code := renewAnswer(t, m); code != tc.want {
				t.Errorf("code %q, want %q", code, tc.want)
			}
		})
	}
	t.Run("replayed", func(t *testing.T) {
		// A request refused after its nonce was stored (another key),
		// sent again.
		data := renewReq(t, other, "web-1", clock.now())
		for i, want := range []protocol.APICode{protocol.APIForbidden, protocol.APIReplayed} {
			m, err := nc.Request(protocol.RenewSubject("web-1"), data, 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if _, code := renewAnswer(t, m); code != want {
				t.Errorf("request %d: %q, want %q", i+1, code, want)
			}
		}
	})
	t.Run("audited", func(t *testing.T) {
		ok := tap.find(t, gw, "renew", audit.OutcomeOK)
		refused := tap.find(t, gw, "renew", audit.OutcomeRefused)
		if ok.Caller.Kind != string(access.KindAgent) || ok.Caller.Subject != pub || len(ok.Hosts) != 1 || ok.Hosts[0] != "web-1" || refused.Reason == "" {
			t.Errorf("renewal records %+v and %+v", ok, refused)
		}
	})
	t.Run("revoked", func(t *testing.T) {
		if err := gw.RevokeAgent(context.Background(), "web-2", "test"); err != nil {
			t.Fatal(err)
		}
		// The revoked agent cannot connect any more; its request is made
		// on the gateway's connection to reach the check behind the
		// permissions.
		m, err := agentRequest(gw.conns.nc, protocol.RenewSubject("web-2"), renewReq(t, other, "web-2", clock.now()), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, code := renewAnswer(t, m); code != protocol.APIHostRevoked {
			t.Errorf("code %q, want host_revoked", code)
		}
	})
}

// The agent's permissions from the signing key's template let it
// publish on its own renewal subject and on no other host's.
func TestAgentTemplateAllowsRenewal(t *testing.T) {
	pub := protocol.AgentPublishAllow("web-1")
	sub := protocol.AgentSubscribeAllow("web-1")
	matches := func(patterns []string, subject string) bool {
		for _, p := range patterns {
			if subjectMatches(p, subject) {
				return true
			}
		}
		return false
	}
	if !matches(pub, protocol.RenewSubject("web-1")) {
		t.Errorf("publish %v does not allow %s", pub, protocol.RenewSubject("web-1"))
	}
	if matches(pub, protocol.RenewSubject("web-2")) {
		t.Errorf("publish %v allows another host's renewal", pub)
	}
	if !matches(sub, protocol.AgentInboxPrefix("web-1")+".abc.1") {
		t.Errorf("subscribe %v does not allow the agent's inbox", sub)
	}
}

// subjectMatches reports whether subject matches the NATS pattern p.
func subjectMatches(p, subject string) bool {
	pt, st := strings.Split(p, "."), strings.Split(subject, ".")
	for i, tok := range pt {
		switch {
		case tok == ">":
			return len(st) > i
		case i >= len(st):
			return false
		case tok != "*" && tok != st[i]:
			return false
		}
	}
	return len(pt) == len(st)
}

// Recovery: refused until an operator allows it, then allowed as many
// times as allowed; refused for another key, a revoked or unknown host.
func TestRecover(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{Uses: 5})
	kp := newUser(t)
	if _, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, time.Now())); code != "" {
		t.Fatal(code)
	}
	recover := func(kp nkeys.KeyPair, host string) (protocol.EnrolResponse, protocol.APICode) {
		var resp protocol.EnrolResponse
		_, aerr := c.do(http.MethodPost, protocol.RecoverPath, recoverReq(t, kp, host, c.pin, time.Now()), &resp)
		if aerr != nil {
			return resp, aerr.Code
		}
		return resp, ""
	}
	if _, code := recover(kp, "web-1"); code != protocol.APINoRecovery {
		t.Fatalf("recovery before it is allowed: %q", code)
	}
	var info protocol.AgentInfo
	if _, aerr := c.do(http.MethodPost, protocol.AdminAgentsPath+"/web-1/allow-recovery", protocol.AllowRecoveryRequest{}, &info); aerr != nil || info.RecoveriesLeft != 1 {
		t.Fatalf("allow recovery: %v %+v", aerr, info)
	}
	if _, code := recover(newUser(t), "web-1"); code != protocol.APIForbidden {
		t.Errorf("another key: %q", code)
	}
	resp, code := recover(kp, "web-1")
	if code != "" || resp.Host != "web-1" || resp.JWT == "" {
		t.Fatalf("recovery: %q %+v", code, resp)
	}
	if rec, _ := gw.Agent(context.Background(), "web-1"); rec.RecoveriesLeft != 0 {
		t.Errorf("recoveries left %d after one, want 0", rec.RecoveriesLeft)
	}
	if _, code := recover(kp, "web-1"); code != protocol.APINoRecovery {
		t.Errorf("a second recovery: %q", code)
	}
	if _, code := recover(kp, "nobody"); code != protocol.APIUnknownHost {
		t.Errorf("unknown host: %q", code)
	}
	if _, aerr := c.do(http.MethodPost, protocol.AdminAgentsPath+"/web-1/allow-recovery", protocol.AllowRecoveryRequest{Count: 2}, nil); aerr != nil {
		t.Fatal(aerr)
	}
	if err := gw.RevokeAgent(context.Background(), "web-1", "test"); err != nil {
		t.Fatal(err)
	}
	if _, code := recover(kp, "web-1"); code != protocol.APIHostRevoked {
		t.Errorf("revoked host: %q", code)
	}
	if _, aerr := c.do(http.MethodPost, protocol.AdminAgentsPath+"/web-1/allow-recovery", nil, nil); aerr == nil || aerr.Code != protocol.APIHostRevoked {
		t.Errorf("allow recovery of a revoked host: %v", aerr)
	}
}

// Bodies that are not one request of the endpoint's shape are refused
// as bad requests: not JSON, unknown fields, two values, too large, the
// wrong method.
func TestAPIBodies(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	c := newAPIClient(t, gw)
	big := `{"token":"` + strings.Repeat("a", protocol.MaxAPIRequestBytes) + `"}`
	for _, tc := range []struct {
		name, method, path string
		body               []byte
		status             int
		code               protocol.APICode
	}{
		{"not JSON", http.MethodPost, protocol.EnrolPath, []byte("token=abc"), 400, protocol.APIBadRequest},
		{"unknown field", http.MethodPost, protocol.EnrolPath, []byte(`{"token":"x","labels":{"role":"admin"}}`), 400, protocol.APIBadRequest},
		{"two values", http.MethodPost, protocol.RecoverPath, []byte(`{"host":"a"} {"host":"b"}`), 400, protocol.APIBadRequest},
		{"oversize", http.MethodPost, protocol.EnrolPath, []byte(big), 400, protocol.APIBadRequest},
		{"empty", http.MethodPost, protocol.EnrolPath, nil, 400, protocol.APIBadRequest},
		{"GET enrol", http.MethodGet, protocol.EnrolPath, nil, 400, protocol.APIBadRequest},
		{"unknown path", http.MethodGet, "/v1/nothing", nil, 404, protocol.APINotFound},
		{"unknown admin path", http.MethodGet, protocol.AdminPath + "secrets", nil, 404, protocol.APINotFound},
		{"admin, wrong method", http.MethodPut, protocol.AdminTokensPath, nil, 405, protocol.APIBadRequest},
		{"bad token create", http.MethodPost, protocol.AdminTokensPath, []byte(`{"ttl":"2000h"}`), 400, protocol.APIBadRequest},
		{"bad labels", http.MethodPost, protocol.AdminAgentsPath + "/web-1/labels", []byte(`{}`), 400, protocol.APIBadRequest},
		{"unknown agent", http.MethodPost, protocol.AdminAgentsPath + "/nobody/revoke", nil, 404, protocol.APINotFound},
		{"unknown token", http.MethodDelete, protocol.AdminTokensPath + "/aaaaaaaaaa", nil, 404, protocol.APINotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, aerr := c.do(tc.method, tc.path, tc.body, nil)
			if aerr == nil || status != tc.status || aerr.Code != tc.code || aerr.Message == "" {
				t.Errorf("status %d, error %+v; want %d %s", status, aerr, tc.status, tc.code)
			}
		})
	}
}

// The fleet API speaks TLS only, with a certificate from the fleet CA
// whose pin it reports.
func TestFleetAPIIsTLS(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	resp, err := http.Get("http://" + gw.APIAddr() + protocol.EnrolPath)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP got %s", resp.Status)
		}
	}
	c := newAPIClient(t, gw)
	conn, err := tls.Dial("tcp", gw.APIAddr(), c.hc.Transport.(*http.Transport).TLSClientConfig.Clone())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	chain := conn.ConnectionState().PeerCertificates
	if got := protocol.CAPin(chain[len(chain)-1]); got != gw.APICAPin() {
		t.Errorf("served chain ends in %s, gateway says %s", got, gw.APICAPin())
	}
	if !strings.HasPrefix(gw.APIURL(), "https://127.0.0.1:") {
		t.Errorf("APIURL %s", gw.APIURL())
	}
}
