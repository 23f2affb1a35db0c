package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// natsToken creates a join token for enrolment over NATS on gw, in
// process (as the admin API does), and decodes it.
func natsToken(t *testing.T, gw *Gateway, req protocol.TokenCreateRequest) (*protocol.TokenCreateResponse, *protocol.NATSJoinToken) {
	t.Helper()
	req.NATS = true
	resp, err := gw.CreateJoinToken(context.Background(), &req, "test")
	if err != nil {
		t.Fatalf("create a NATS join token: %v", err)
	}
	nt, err := protocol.ParseNATSJoinToken(resp.Token)
	if err != nil {
		t.Fatalf("the NATS join token does not parse: %v", err)
	}
	return resp, nt
}

// enrolConn dials gw's NATS server with a NATS token's enrol credential,
// trusting the fleet CA alone; errs gets the server's asynchronous
// errors (permission violations).
type enrolConn struct {
	nc     *nats.Conn
	mu     sync.Mutex
	errs   []string
	closed chan struct{}
}

func dialEnrol(gw *Gateway, nt *protocol.NATSJoinToken) (*enrolConn, error) {
	id, _, _ := protocol.ParseJoinToken(nt.Token)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(gw.NATSCAPEM())
	c := &enrolConn{closed: make(chan struct{})}
	nc, err := nats.Connect(gw.NATSURL(), nats.UserJWTAndSeed(nt.JWT, nt.Seed), nats.CustomInboxPrefix(protocol.EnrolInboxPrefix(id)),
		nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(c.closed) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			c.errs = append(c.errs, err.Error())
			c.mu.Unlock()
		}))
	if err != nil {
		return nil, err
	}
	c.nc = nc
	return c, nil
}

func mustDialEnrol(t *testing.T, gw *Gateway, nt *protocol.NATSJoinToken) *enrolConn {
	t.Helper()
	c, err := dialEnrol(gw, nt)
	if err != nil {
		t.Fatalf("dial with the enrol credential: %v", err)
	}
	t.Cleanup(c.nc.Close)
	return c
}

// waitErr waits for an asynchronous error holding want.
func (c *enrolConn) waitErr(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		_ = c.nc.Flush()
		c.mu.Lock()
		for _, e := range c.errs {
			if strings.Contains(e, want) {
				c.mu.Unlock()
				return
			}
		}
		c.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Fatalf("no error %q from the server; got %q", want, c.errs)
}

// natsEnrol sends r on the subject of token id and returns the answer or
// the error code.
func natsEnrol(t *testing.T, nc *nats.Conn, id string, r any) (protocol.EnrolResponse, protocol.APICode) {
	t.Helper()
	data, _ := json.Marshal(r)
	m, err := nc.Request(protocol.EnrolSubject(id), data, 20*time.Second)
	if err != nil {
		t.Fatalf("enrol over NATS: %v", err)
	}
	var probe struct {
		Code protocol.APICode `json:"code"`
	}
	if err := json.Unmarshal(m.Data, &probe); err != nil {
		t.Fatalf("answer %q: %v", m.Data, err)
	}
	var resp protocol.EnrolResponse
	if probe.Code == "" {
		if err := json.Unmarshal(m.Data, &resp); err != nil {
			t.Fatal(err)
		}
	}
	return resp, probe.Code
}

// waitRefused waits until the enrol credential of nt no longer connects:
// the server refuses it as revoked.
func waitRefused(t *testing.T, gw *Gateway, nt *protocol.NATSJoinToken) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := dialEnrol(gw, nt)
		if err != nil {
			if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
				t.Fatalf("the enrol credential is refused, but not for authorization: %v", err)
			}
			return
		}
		c.nc.Close()
		if time.Now().After(deadline) {
			t.Fatal("the enrol credential still connects")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A host enrols over NATS alone (no fleet API): with the enrol credential
// it sends the same request as over HTTPS and gets the same answer, a
// credential the server takes; the enrolment is audited. Once the token
// is spent and the retry window over, the enrol credential's connection
// is closed and the server refuses it from then on.
func TestEnrolOverNATS(t *testing.T) {
	gw := startAPIGateway(t, nil, func(c *Config) { c.NATSTLS = true; c.APIListen = ""; c.EnrolRetryWindow = time.Second })
	resp, nt := natsToken(t, gw, protocol.TokenCreateRequest{Labels: map[string]string{"env": "prod"}, Name: "web-1"})
	if !strings.Contains(resp.JoinCommand, "--nats tls://") || !strings.Contains(resp.JoinCommand, "--ca_pin "+gw.NATSCAPin()) || resp.CAPin != gw.NATSCAPin() {
		t.Fatalf("join command %q, pin %q", resp.JoinCommand, resp.CAPin)
	}
	if !resp.Info.NATS || len(resp.NATSURLs) == 0 {
		t.Fatalf("token info %+v, urls %v", resp.Info, resp.NATSURLs)
	}
	tap := tapAudit(t, gw)
	c := mustDialEnrol(t, gw, nt)
	kp := newUser(t)
	got, code := natsEnrol(t, c.nc, resp.Info.ID, enrolReq(t, kp, nt.Token, "", gw.NATSCAPin(), time.Now()))
	if code != "" {
		t.Fatalf("enrolment over NATS refused: %s", code)
	}
	if got.Host != "web-1" || got.Labels["env"] != "prod" || got.NATSCA == "" {
		t.Fatalf("answer %+v", got)
	}
	nc := agentConn(t, gw, "web-1", kp, got)
	if err := nc.Publish(protocol.PresenceSubject("web-1"), []byte("{}")); err != nil || nc.Flush() != nil {
		t.Fatalf("the credential does not work: %v", err)
	}
	select {
	case <-c.closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the enrol credential's connection stays open after the token was spent")
	}
	waitRefused(t, gw, nt)
	if r := tap.find(t, gw, "enrol", audit.OutcomeOK); r.Source != "nats" || r.Target != resp.Info.ID || len(r.Hosts) != 1 || r.Hosts[0] != "web-1" {
		t.Fatalf("audit record %+v", r)
	}
}

// The enrol credential is good for its token's enrolment subject and
// inbox alone: subscribing to fleet subjects, other inboxes or
// everything, publishing presence, calls, renewals or on another token's
// subject are refused by the server; so are more subscriptions than the
// request needs and a large payload. A request carrying another token on
// this token's subject is refused by the gateway, and a flood of bad
// requests is throttled.
func TestEnrolCredentialEscapes(t *testing.T) {
	gw := startAPIGateway(t, nil, func(c *Config) { c.NATSTLS = true; c.APIListen = "" })
	resp, nt := natsToken(t, gw, protocol.TokenCreateRequest{Uses: 2})
	other, _ := natsToken(t, gw, protocol.TokenCreateRequest{})
	id := resp.Info.ID
	c := mustDialEnrol(t, gw, nt)
	for _, subj := range []string{">", "fleet.v1.>", "fleet.v1.presence.*", "fleet.v1.host.web-1.>", protocol.DiscoverSubject(),
		"_INBOX.>", "_INBOX_web-1.>", "_INBOX_enrol_" + id + ".>", protocol.EnrolInboxPrefix(other.Info.ID) + ".>", "_ENROL_INBOX.>",
		"$SYS.>", "$JS.>", "$KV.fleet_tokens.>", protocol.EnrolSubject(id)} {
		if _, err := c.nc.SubscribeSync(subj); err != nil {
			t.Fatalf("subscribe %s: %v", subj, err)
		}
		c.waitErr(t, `Permissions Violation for Subscription to "`+subj+`"`)
	}
	for _, subj := range []string{protocol.PresenceSubject("web-1"), "fleet.v1.agent.web-1.renew", protocol.EnrolSubject(other.Info.ID),
		"fleet.v1.host.web-1.call", "$JS.API.INFO", "$KV.fleet_tokens." + id, "$SYS.REQ.ACCOUNT.PING.CONNZ", "_INBOX_gw.x"} {
		if err := c.nc.Publish(subj, []byte("{}")); err != nil {
			t.Fatalf("publish %s: %v", subj, err)
		}
		c.waitErr(t, `Permissions Violation for Publish to "`+subj+`"`)
	}
	// Another token's secret on this token's subject.
	_, otherNT := natsToken(t, gw, protocol.TokenCreateRequest{})
	if _, code := natsEnrol(t, c.nc, id, enrolReq(t, newUser(t), otherNT.Token, "web-2", gw.NATSCAPin(), time.Now())); code != protocol.APIBadRequest {
		t.Fatalf("another token on this token's subject: %q", code)
	}
	// Subscriptions: the inbox of the requests, and one more, are all it
	// may hold.
	for i := range protocol.EnrolMaxSubs + 1 {
		if _, err := c.nc.SubscribeSync(protocol.EnrolInboxPrefix(id) + ".x" + string(rune('a'+i))); err != nil {
			t.Fatal(err)
		}
	}
	c.waitErr(t, "maximum subscriptions exceeded")

	// A flood of bad requests is throttled: refused as unavailable once
	// the burst is spent.
	f := mustDialEnrol(t, gw, nt)
	var code protocol.APICode
	for range failureBurst + 2 {
		if _, code = natsEnrol(t, f.nc, id, map[string]string{"token": "x"}); code == protocol.APIUnavailable {
			break
		}
	}
	if code != protocol.APIUnavailable {
		t.Fatalf("a flood of bad requests is not throttled: last %q", code)
	}

	// A payload larger than a request closes the connection: the
	// credential's payload limit is a request's size. The server lifts
	// a connection's limit for a moment while it applies an updated
	// account (revoking a token's credential is one), and a payload
	// that arrives then reaches the gateway, which refuses it by its
	// own bound. A client that heard the server announce the
	// credential's limit refuses to send it at all. Either way nothing
	// is enrolled.
	p := mustDialEnrol(t, gw, nt)
	m, err := p.nc.Request(protocol.EnrolSubject(id), make([]byte, protocol.EnrolMaxPayload+1), 10*time.Second)
	if errors.Is(err, nats.ErrMaxPayload) {
		if got := p.nc.MaxPayload(); got != protocol.EnrolMaxPayload {
			t.Fatalf("the client refused a payload over its limit of %d; the credential's limit is %d", got, protocol.EnrolMaxPayload)
		}
		return
	}
	if err == nil {
		var probe struct {
			Code protocol.APICode `json:"code"`
		}
		if jerr := json.Unmarshal(m.Data, &probe); jerr != nil || probe.Code != protocol.APIBadRequest {
			t.Fatalf("a payload over the limit reached the gateway and was answered %q, want code %q", m.Data, protocol.APIBadRequest)
		}
		return
	}
	select {
	case <-p.closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("a payload over the limit neither closes the connection nor is refused: %v", err)
	}
}

// The enrol credential stops working with its token: revoked by an
// operator at once, or spent by an enrolment over HTTPS once the retry
// window is over.
func TestEnrolCredentialRevokedWithToken(t *testing.T) {
	gw := startAPIGateway(t, nil, func(c *Config) { c.NATSTLS = true; c.EnrolRetryWindow = time.Second })
	admin := newAPIClient(t, gw)
	revoked, nt := natsToken(t, gw, protocol.TokenCreateRequest{})
	c := mustDialEnrol(t, gw, nt)
	if _, aerr := admin.do(http.MethodDelete, protocol.AdminTokensPath+"/"+revoked.Info.ID, nil, nil); aerr != nil {
		t.Fatalf("revoke: %v", aerr)
	}
	select {
	case <-c.closed:
	case <-time.After(20 * time.Second):
		t.Fatal("the enrol credential's connection stays open after the token was revoked")
	}
	waitRefused(t, gw, nt)

	spent, nt2 := natsToken(t, gw, protocol.TokenCreateRequest{})
	if _, code := admin.enrol(enrolReq(t, newUser(t), nt2.Token, "web-3", gw.APICAPin(), time.Now())); code != "" {
		t.Fatalf("enrol over HTTPS with a NATS token: %s", code)
	}
	waitRefused(t, gw, nt2)
	if ti := admin.tokenInfo(spent.Info.ID); ti.State != protocol.TokenSpent || !ti.NATS {
		t.Fatalf("token %+v", ti)
	}
}

// A spent token is refused over NATS like over HTTPS, while its enrol
// credential still connects (the revocation follows the retry window); a
// wrong pin in the request is refused.
func TestEnrolOverNATSRefusals(t *testing.T) {
	gw := startAPIGateway(t, nil, func(c *Config) { c.NATSTLS = true; c.APIListen = ""; c.EnrolRetryWindow = time.Second })
	resp, nt := natsToken(t, gw, protocol.TokenCreateRequest{Uses: 2})
	c := mustDialEnrol(t, gw, nt)
	id := resp.Info.ID
	if _, code := natsEnrol(t, c.nc, id, enrolReq(t, newUser(t), nt.Token, "h1", "sha256:"+strings.Repeat("0", 64), time.Now())); code != protocol.APIWrongCA {
		t.Fatalf("a wrong pin: %q", code)
	}
	if _, code := natsEnrol(t, c.nc, id, enrolReq(t, newUser(t), nt.Token, "h1", gw.NATSCAPin(), time.Now())); code != "" {
		t.Fatalf("first use: %q", code)
	}
	// The second use spends it; the same request is then spent.
	if _, code := natsEnrol(t, c.nc, id, enrolReq(t, newUser(t), nt.Token, "h2", gw.NATSCAPin(), time.Now())); code != "" {
		t.Fatalf("second use: %q", code)
	}
	if c2, err := dialEnrol(gw, nt); err == nil {
		// Still in before the revocation was pushed: the gateway refuses
		// the spent token.
		defer c2.nc.Close()
		data, _ := json.Marshal(enrolReq(t, newUser(t), nt.Token, "h3", gw.NATSCAPin(), time.Now()))
		if m, err := c2.nc.Request(protocol.EnrolSubject(id), data, 10*time.Second); err == nil && !strings.Contains(string(m.Data), string(protocol.APITokenSpent)) {
			t.Fatalf("a spent token: %s", m.Data)
		} else if err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("a spent token: %v", err)
		}
	}
	waitRefused(t, gw, nt)
}

// With the fleet API on an external cluster's gateway or without TLS on
// NATS, a NATS token is refused with the reason.
func TestNATSTokenNeedsTLS(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	_, err := gw.CreateJoinToken(context.Background(), &protocol.TokenCreateRequest{NATS: true}, "test")
	if err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("a NATS token without NATS TLS: %v", err)
	}
}

// A client may not make the gateway publish where it may not itself: a
// request whose reply subject is not under the sender's own inbox (an
// enrol credential's, an agent's) gets no answer, however it would be
// answered, and is audited as refused. Without this, the gateway's
// unrestricted connection would publish the answer to a presence subject,
// another host's calls or the JetStream API.
func TestNoAnswerOutsideTheSendersInbox(t *testing.T) {
	clock := &testClock{t: time.Now()}
	gw := startAPIGateway(t, clock, func(c *Config) { c.NATSTLS = true })
	tap := tapAudit(t, gw)
	// The observer shares the tap's connection, so what the gateway
	// publishes before the audit record reaches it first.
	observed := map[string]*nats.Subscription{}
	targets := []string{protocol.PresenceSubject("web-9"), "fleet.v1.host.web-9.call", "$JS.API.STREAM.PURGE.FLEET_AUDIT", "_INBOX_web-9.x"}
	for _, s := range targets {
		sub, err := gw.conns.nc.SubscribeSync(s)
		if err != nil {
			t.Fatal(err)
		}
		observed[s] = sub
	}
	if err := gw.conns.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	checkNothing := func(what string) {
		t.Helper()
		for s, sub := range observed {
			if n, _, _ := sub.Pending(); n != 0 {
				m, _ := sub.NextMsg(0)
				t.Errorf("%s: the gateway published on %s: %s", what, s, m.Data)
			}
		}
	}

	resp, nt := natsToken(t, gw, protocol.TokenCreateRequest{Uses: 10})
	e := mustDialEnrol(t, gw, nt)
	for _, reply := range targets {
		data, _ := json.Marshal(enrolReq(t, newUser(t), nt.Token, "", gw.NATSCAPin(), time.Now()))
		if err := e.nc.PublishRequest(protocol.EnrolSubject(resp.Info.ID), reply, data); err != nil {
			t.Fatal(err)
		}
		r := tap.first(t, gw, "enrol")
		checkNothing("enrol reply " + reply)
		if r.Reason != string(protocol.APIBadRequest) || !strings.Contains(r.Error, "reply subject") {
			t.Errorf("audit %+v", r)
		}
		tap.mu.Lock()
		tap.recs = nil
		tap.mu.Unlock()
	}
	if ti := newAPIClient(t, gw).tokenInfo(resp.Info.ID); ti.Used != 0 {
		t.Errorf("a request with a foreign reply subject used the token: %+v", ti)
	}

	// An agent's renewal.
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{})
	kp := newUser(t)
	first, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, time.Now()))
	if code != "" {
		t.Fatal(code)
	}
	nc := agentConn(t, gw, "web-1", kp, first)
	// Past half the credential's life: an earlier renewal is refused
	// before its reply subject is looked at, and not audited (renew.go,
	// screenRenewal).
	clock.advance(gw.cfg.AgentCredentialTTL/2 + time.Minute)
	for _, reply := range targets {
		if err := nc.PublishRequest(protocol.RenewSubject("web-1"), reply, renewReq(t, kp, "web-1", clock.now())); err != nil {
			t.Fatal(err)
		}
		r := tap.first(t, gw, "renew")
		checkNothing("renewal reply " + reply)
		if !strings.Contains(r.Error, "reply subject") {
			t.Errorf("audit %+v", r)
		}
		tap.mu.Lock()
		tap.recs = nil
		tap.mu.Unlock()
	}
}

// first waits until a record for tool is stored, and returns it.
func (tap *auditTap) first(t *testing.T, gw *Gateway, tool string) audit.Record {
	t.Helper()
	var found audit.Record
	waitUntil(t, "audit record "+tool, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gw.subsys.audit.Sync(ctx)
		_ = gw.conns.nc.Flush()
		tap.mu.Lock()
		defer tap.mu.Unlock()
		for _, r := range tap.recs {
			if r.Tool == tool {
				found = r
				return true
			}
		}
		return false
	})
	return found
}
