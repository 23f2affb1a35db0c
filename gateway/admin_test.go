package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/integration/oidctest"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// auditTap collects the audit records a gateway stores.
type auditTap struct {
	mu   sync.Mutex
	recs []audit.Record
}

func tapAudit(t *testing.T, gw *Gateway) *auditTap {
	t.Helper()
	tap := &auditTap{}
	sub, err := gw.conns.nc.Subscribe(protocol.AuditSubject(), func(m *nats.Msg) {
		var r audit.Record
		if json.Unmarshal(m.Data, &r) == nil {
			tap.mu.Lock()
			tap.recs = append(tap.recs, r)
			tap.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := gw.conns.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return tap
}

// find waits until a record for tool with the outcome is stored, and
// returns it.
func (tap *auditTap) find(t *testing.T, gw *Gateway, tool, outcome string) audit.Record {
	t.Helper()
	var found audit.Record
	waitUntil(t, "audit record "+tool+" "+outcome, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gw.subsys.audit.Sync(ctx)
		_ = gw.conns.nc.Flush()
		tap.mu.Lock()
		defer tap.mu.Unlock()
		for _, r := range tap.recs {
			if r.Tool == tool && r.Outcome == outcome {
				found = r
				return true
			}
		}
		return false
	})
	return found
}

func tokenLine(name, token string, admin bool) string {
	sum := sha256.Sum256([]byte(token))
	line := `  - {name: ` + name + `, sha256: "` + hex.EncodeToString(sum[:]) + `", hosts: ["*"], tools: [read]`
	if admin {
		line += ", admin: true"
	}
	return line + "}\n"
}

// The admin API needs an admin: an admin API token or an OIDC token whose
// access rule says admin. No token is 401, a refused token 401, a caller
// that is no admin 403; each action is an audit record naming the
// caller, the action, the target and the outcome.
func TestAdminAuth(t *testing.T) {
	is := oidctest.New(t, "fleet", "rsa-1")
	adminTok, readerTok := "fmcp_admin-token-for-the-test", "fmcp_reader-token-for-the-test"
	tokens, err := access.ParseAPITokens("tokens", []byte("tokens:\n"+tokenLine("ops", adminTok, true)+tokenLine("reader", readerTok, false)))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := access.ParseRules("rules", []byte(`
rules:
  - name: ops
    match: {groups: ops}
    hosts: ["*"]
    tools: ["*"]
    admin: true
  - name: devs
    match: {groups: devs}
    hosts: ["*"]
    tools: [read]
`))
	if err != nil {
		t.Fatal(err)
	}
	gw := startAPIGateway(t, nil, func(c *Config) {
		c.AuthDisabled = false
		c.Auth = access.AuthConfig{Issuer: is.URL(), Audience: "fleet", APITokens: tokens}
		c.Access = rules
	})
	tap := tapAudit(t, gw)
	c := newAPIClient(t, gw)
	as := func(token string) *apiClient { cc := *c; cc.token = token; return &cc }
	oidc := func(groups string) string {
		cl := is.Claims("user-"+groups, nil)
		cl["groups"] = []any{groups}
		cl["email"] = groups + "@example.com"
		return is.Token("rsa-1", cl)
	}
	for _, tc := range []struct {
		name   string
		token  string
		status int
		code   protocol.APICode
	}{
		{"no token", "", 401, protocol.APIUnauthorized},
		{"unknown API token", "fmcp_nobody", 401, protocol.APIUnauthorized},
		{"garbage", "not-a-jwt", 401, protocol.APIUnauthorized},
		{"API token, not admin", readerTok, 403, protocol.APIForbidden},
		{"OIDC, rule without admin", oidc("devs"), 403, protocol.APIForbidden},
		{"OIDC, no rule", oidc("nobody"), 403, protocol.APIForbidden},
		{"admin API token", adminTok, 200, ""},
		{"OIDC, admin rule", oidc("ops"), 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, aerr := as(tc.token).do(http.MethodGet, protocol.AdminTokensPath, nil, nil)
			if status != tc.status || (aerr == nil) != (tc.code == "") || aerr != nil && aerr.Code != tc.code {
				t.Errorf("status %d, error %+v; want %d %q", status, aerr, tc.status, tc.code)
			}
		})
	}
	denied := tap.find(t, gw, "admin", audit.OutcomeRefused)
	if denied.Decision != audit.DecisionDenied || denied.Caller.Subject == "" {
		t.Errorf("refused admin record %+v", denied)
	}

	admin := as(adminTok)
	tok := admin.createToken(protocol.TokenCreateRequest{Labels: map[string]string{"env": "prod"}, Uses: 3, NamePattern: "web-*"})
	if tok.Info.CreatedBy != "token ops" || !strings.Contains(tok.JoinCommand, "--name NAME") {
		t.Errorf("token %+v", tok)
	}
	rec := tap.find(t, gw, "admin_token_create", audit.OutcomeOK)
	if rec.Caller.Kind != string(access.KindAPIToken) || rec.Caller.Subject != "ops" || rec.Target != tok.Info.ID || rec.Source != "127.0.0.1" {
		t.Errorf("token create record %+v", rec)
	}
	if line := rec.Line(); !strings.Contains(line, "\ttarget "+tok.Info.ID+"\t") {
		t.Errorf("the audit tool's line %q does not name the token", line)
	}
	if strings.Contains(mustJSON(t, rec), strings.Split(tok.Token, ".")[2]) {
		t.Error("the audit record holds the token's secret")
	}
	kp := newUser(t)
	if _, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, time.Now())); code != "" {
		t.Fatal(code)
	}
	if rec := tap.find(t, gw, "enrol", audit.OutcomeOK); rec.Caller.Kind != string(access.KindAgent) || rec.Target != tok.Info.ID || len(rec.Hosts) != 1 || rec.Hosts[0] != "web-1" {
		t.Errorf("enrol record %+v", rec)
	}
	if _, code := c.enrol(enrolReq(t, newUser(t), tok.Token, "db-1", c.pin, time.Now())); code != protocol.APINameNotAllowed {
		t.Fatal(code)
	}
	if rec := tap.find(t, gw, "enrol", audit.OutcomeRefused); rec.Reason != string(protocol.APINameNotAllowed) || rec.Decision != audit.DecisionDenied {
		t.Errorf("refused enrol record %+v", rec)
	}

	var info protocol.AgentInfo
	if _, aerr := as(oidc("ops")).do(http.MethodPost, protocol.AdminAgentsPath+"/web-1/labels",
		protocol.LabelsRequest{Set: map[string]string{"role": "web"}, Remove: []string{"env"}}, &info); aerr != nil {
		t.Fatal(aerr)
	}
	if info.Labels["role"] != "web" || info.Labels["env"] != "" {
		t.Errorf("labels %v", info.Labels)
	}
	if rec := tap.find(t, gw, "admin_agent_labels", audit.OutcomeOK); rec.Caller.Kind != string(access.KindOIDC) || rec.Caller.Subject != "user-ops" || rec.Target != "web-1" || len(rec.Hosts) != 1 {
		t.Errorf("labels record %+v", rec)
	}
	var list protocol.AgentList
	if _, aerr := admin.do(http.MethodGet, protocol.AdminAgentsPath, nil, &list); aerr != nil || len(list.Agents) != 1 || list.Agents[0].Host != "web-1" {
		t.Fatalf("agents %v %+v", aerr, list)
	}
	tap.find(t, gw, "admin_agent_list", audit.OutcomeOK)
	if _, aerr := admin.do(http.MethodPost, protocol.AdminAgentsPath+"/web-1/revoke", nil, &info); aerr != nil || info.RevokedAt.IsZero() || info.RevokedBy != "token ops" {
		t.Fatalf("revoke: %v %+v", aerr, info)
	}
	tap.find(t, gw, "admin_agent_revoke", audit.OutcomeOK)
	var ti protocol.TokenInfo
	if _, aerr := admin.do(http.MethodDelete, protocol.AdminTokensPath+"/"+tok.Info.ID, nil, &ti); aerr != nil || ti.State != protocol.TokenRevoked {
		t.Fatalf("token revoke: %v %+v", aerr, ti)
	}
	tap.find(t, gw, "admin_token_revoke", audit.OutcomeOK)
	tap.find(t, gw, "admin_token_list", audit.OutcomeOK)
	if _, aerr := admin.do(http.MethodPost, protocol.AdminAgentsPath+"/nobody/allow-recovery", nil, nil); aerr == nil || aerr.Code != protocol.APINotFound {
		t.Errorf("allow recovery of an unknown host: %v", aerr)
	}
	tap.find(t, gw, "admin_agent_allow_recovery", audit.OutcomeRefused)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// With authentication off, the caller on this machine is the admin.
func TestAdminAuthOff(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{})
	if tok.Info.CreatedBy != "local" {
		t.Errorf("created by %q", tok.Info.CreatedBy)
	}
	r, _ := http.NewRequest(http.MethodGet, protocol.AdminTokensPath, nil)
	r.RemoteAddr = "192.0.2.7:5555"
	if _, aerr := gw.adminCaller(r); aerr == nil || aerr.Code != protocol.APIForbidden {
		t.Errorf("a remote caller with authentication off: %v", aerr)
	}
	// A reverse proxy on this machine connects from loopback, for callers
	// anywhere: what it forwards is not the local caller's.
	for _, h := range []string{"X-Forwarded-For", "Forwarded", "X-Real-IP", "X-Forwarded-Host"} {
		r, _ := http.NewRequest(http.MethodGet, protocol.AdminTokensPath, nil)
		r.RemoteAddr = "127.0.0.1:5555"
		r.Header.Set(h, "203.0.113.9")
		if _, aerr := gw.adminCaller(r); aerr == nil || aerr.Code != protocol.APIForbidden {
			t.Errorf("a request forwarded by a local proxy (%s) with authentication off: %v", h, aerr)
		}
	}
	r.RemoteAddr = "127.0.0.1:5555"
	if _, aerr := gw.adminCaller(r); aerr != nil {
		t.Errorf("the local caller, directly: %v", aerr)
	}
}

// Tokens that stopped working are listed for a day, then swept; tokens
// that work are kept; two gateways sweeping at once do no harm.
func TestTokenSweep(t *testing.T) {
	clock := &testClock{t: time.Now()}
	gw := startAPIGateway(t, clock, nil)
	c := newAPIClient(t, gw)
	active := c.createToken(protocol.TokenCreateRequest{TTL: "720h"})
	expired := c.createToken(protocol.TokenCreateRequest{TTL: "1h"})
	spent := c.createToken(protocol.TokenCreateRequest{TTL: "720h"})
	if _, code := c.enrol(enrolReq(t, newUser(t), spent.Token, "h1", c.pin, time.Now())); code != "" {
		t.Fatal(code)
	}
	revoked := c.createToken(protocol.TokenCreateRequest{TTL: "720h"})
	if _, aerr := c.do(http.MethodDelete, protocol.AdminTokensPath+"/"+revoked.Info.ID, nil, nil); aerr != nil {
		t.Fatal(aerr)
	}
	ctx := context.Background()
	// Just stopped: listed with why.
	clock.advance(2 * time.Hour)
	if n, err := gw.subsys.enrol.SweepTokens(ctx, clock.now()); err != nil || n != 0 {
		t.Fatalf("sweep at once: %d %v", n, err)
	}
	for id, want := range map[string]string{active.Info.ID: protocol.TokenActive, expired.Info.ID: protocol.TokenExpired,
		spent.Info.ID: protocol.TokenSpent, revoked.Info.ID: protocol.TokenRevoked} {
		if got := c.tokenInfo(id).State; got != want {
			t.Errorf("token %s: %s, want %s", id, got, want)
		}
	}
	clock.advance(24 * time.Hour) // how long a token that stopped working is kept
	var wg sync.WaitGroup
	counts := make([]int, 3)
	for i := range counts {
		wg.Go(func() {
			n, err := gw.subsys.enrol.SweepTokens(ctx, clock.now())
			if err != nil {
				t.Error(err)
			}
			counts[i] = n
		})
	}
	wg.Wait()
	if total := counts[0] + counts[1] + counts[2]; total != 3 {
		t.Errorf("concurrent sweeps deleted %v tokens, want 3 in all", counts)
	}
	var list protocol.TokenList
	if _, aerr := c.do(http.MethodGet, protocol.AdminTokensPath, nil, &list); aerr != nil {
		t.Fatal(aerr)
	}
	if len(list.Tokens) != 1 || list.Tokens[0].ID != active.Info.ID {
		t.Errorf("after the sweep: %+v", list.Tokens)
	}
	if _, code := c.enrol(enrolReq(t, newUser(t), expired.Token, "h2", c.pin, clock.now())); code != protocol.APITokenUnknown {
		t.Errorf("a swept token: %q", code)
	}
}

func FuzzParseAdminPath(f *testing.F) {
	for _, s := range []string{protocol.AdminTokensPath, protocol.AdminTokensPath + "/abcdefghij", protocol.AdminAgentsPath,
		protocol.AdminAgentsPath + "/web-1/revoke", protocol.AdminAgentsPath + "/web-1/labels/x", protocol.AdminAgentsPath + "//revoke",
		protocol.AdminPath + "tokens/../agents", "/v1/admin/agents/a.b/revoke", "/v1/enrol",
		protocol.AdminKeysPath + "/UAJ5LGB3VYTXCKNBYXEE2ADDBY3PSOCVBZNUBDD7UJKMJ5UDHI3SSVUT/revoke", protocol.AdminKeysPath + "/U/revoke"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		r, err := parseAdminPath(path)
		if err != nil {
			return
		}
		switch r.kind {
		case "tokens", "agents":
			if r.target != "" || path != protocol.AdminPath+r.kind {
				t.Errorf("%q: %+v", path, r)
			}
		case "token":
			if protocol.CheckTokenID(r.target) != nil || path != protocol.AdminTokensPath+"/"+r.target {
				t.Errorf("%q: %+v", path, r)
			}
		case "agent":
			if protocol.ValidateHost(r.target) != nil || path != protocol.AdminAgentsPath+"/"+r.target+"/"+r.action {
				t.Errorf("%q: %+v", path, r)
			}
		case "key":
			if !nkeys.IsValidPublicUserKey(r.target) || r.action != actionRevoke || path != protocol.AdminKeysPath+"/"+r.target+"/revoke" {
				t.Errorf("%q: %+v", path, r)
			}
		default:
			t.Errorf("%q: kind %q", path, r.kind)
		}
	})
}

// Any body is either refused with a bad request or decodes into one
// request (whose checks gateway/enrol fuzzes).
func FuzzDecodeEnrolRequest(f *testing.F) {
	f.Add([]byte(`{"token":"fmcp1.aaaaaaaaaa.x","host":"web-1","ca_pin":"sha256:00","public_key":"U","nonce":"n","time":"2026-01-01T00:00:00Z","signature":"s"}`))
	f.Add([]byte(`{"facts":{"os":"linux"}} {}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req protocol.EnrolRequest
		if aerr := decodeAPIJSON(strings.NewReader(string(data)), &req); aerr != nil {
			if aerr.Code != protocol.APIBadRequest || aerr.Message == "" {
				t.Errorf("%q: %+v", data, aerr)
			}
			return
		}
	})
}

// Refused requests from one address are limited: a burst, then one per
// failureEvery; other addresses are not affected, and time restores them.
func TestFailureLimiter(t *testing.T) {
	f := newFailureLimiter()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range failureBurst {
		if _, ok := f.allowed("192.0.2.1", now); !ok {
			t.Fatalf("refused after %d failures, before the burst of %d", i, failureBurst)
		}
		f.fail("192.0.2.1", now)
	}
	wait, ok := f.allowed("192.0.2.1", now)
	if ok || wait <= 0 || wait > failureEvery {
		t.Errorf("after the burst: allowed %v, wait %s", ok, wait)
	}
	if _, ok := f.allowed("192.0.2.2", now); !ok {
		t.Error("another address is refused")
	}
	if _, ok := f.allowed("192.0.2.1", now.Add(failureEvery)); !ok {
		t.Error("still refused a refill later")
	}
}
