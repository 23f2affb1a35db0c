package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// startAPIGateway starts a gateway with embedded NATS (listening on
// loopback for agents) and the fleet API on a loopback port, with the
// clock clock, adjusted by mod.
func startAPIGateway(t *testing.T, clock *testClock, mod func(*Config)) *Gateway {
	t.Helper()
	cfg := Config{
		Listen: "127.0.0.1:0", DataDir: t.TempDir(), NATSListen: "127.0.0.1:0", APIListen: "127.0.0.1:0",
		AuthDisabled: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if clock != nil {
		cfg.clock = clock.now
	}
	if mod != nil {
		mod(&cfg)
	}
	gw, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return gw
}

// apiClient speaks to the fleet API as a host (and fleetctl) would: over
// HTTPS, trusting the fleet CA alone.
type apiClient struct {
	t     *testing.T
	base  string
	pin   string
	hc    *http.Client
	token string // admin bearer token
}

func newAPIClient(t *testing.T, gw *Gateway) *apiClient {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(gw.cfg.DataDir, natsauth.TLSDir, natsauth.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &apiClient{t: t, base: "https://" + gw.APIAddr(), pin: gw.APICAPin(), hc: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// do sends a request with body (raw bytes, or a value to encode) and
// decodes the answer into out, or returns the API error.
func (c *apiClient) do(method, path string, body any, out any) (int, *protocol.APIError) {
	c.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		var aerr protocol.APIError
		if err := json.Unmarshal(data, &aerr); err != nil || aerr.Code == "" {
			c.t.Fatalf("%s %s: %s with a body that is no API error: %q", method, path, resp.Status, data)
		}
		return resp.StatusCode, &aerr
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			c.t.Fatalf("%s %s: %v in %q", method, path, err, data)
		}
	}
	return resp.StatusCode, nil
}

// createToken makes a join token through the admin API.
func (c *apiClient) createToken(req protocol.TokenCreateRequest) protocol.TokenCreateResponse {
	c.t.Helper()
	var resp protocol.TokenCreateResponse
	if _, aerr := c.do(http.MethodPost, protocol.AdminTokensPath, req, &resp); aerr != nil {
		c.t.Fatalf("create token: %v", aerr)
	}
	return resp
}

// tokenInfo returns the token id as listed.
func (c *apiClient) tokenInfo(id string) protocol.TokenInfo {
	c.t.Helper()
	var list protocol.TokenList
	if _, aerr := c.do(http.MethodGet, protocol.AdminTokensPath, nil, &list); aerr != nil {
		c.t.Fatalf("list tokens: %v", aerr)
	}
	for _, ti := range list.Tokens {
		if ti.ID == id {
			return ti
		}
	}
	c.t.Fatalf("token %s not listed", id)
	return protocol.TokenInfo{}
}

// signProof fills p for kp at time at, with a fresh nonce, and signs
// signing (called with p filled in but for the signature).
func signProof(t *testing.T, kp nkeys.KeyPair, p *protocol.Proof, at time.Time, signing func() []byte) {
	t.Helper()
	p.PublicKey, _ = kp.PublicKey()
	p.Nonce = protocol.NewNonce()
	p.Time = at.UTC()
	sig, err := kp.Sign(signing())
	if err != nil {
		t.Fatal(err)
	}
	p.Signature = base64.RawURLEncoding.EncodeToString(sig)
}

func enrolReq(t *testing.T, kp nkeys.KeyPair, token, host, pin string, at time.Time) *protocol.EnrolRequest {
	t.Helper()
	r := &protocol.EnrolRequest{Token: token, Host: host, CAPin: pin, Facts: protocol.AgentFacts{OS: "linux", Arch: "amd64", Hostname: host}}
	signProof(t, kp, &r.Proof, at, r.SigningBytes)
	return r
}

func recoverReq(t *testing.T, kp nkeys.KeyPair, host, pin string, at time.Time) *protocol.RecoverRequest {
	t.Helper()
	r := &protocol.RecoverRequest{Host: host, CAPin: pin}
	signProof(t, kp, &r.Proof, at, r.SigningBytes)
	return r
}

func newUser(t *testing.T) nkeys.KeyPair {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// enrol sends r and returns the answer or the error code.
func (c *apiClient) enrol(r *protocol.EnrolRequest) (protocol.EnrolResponse, protocol.APICode) {
	c.t.Helper()
	var resp protocol.EnrolResponse
	_, aerr := c.do(http.MethodPost, protocol.EnrolPath, r, &resp)
	if aerr != nil {
		return resp, aerr.Code
	}
	return resp, ""
}

// A host enrols with a token over HTTPS: it gets a credential for its
// key and name that the NATS server takes, the NATS URLs and CA, and the
// token's labels; its record holds its facts and the token.
func TestEnrolOverHTTPS(t *testing.T) {
	gw := startAPIGateway(t, nil, func(c *Config) { c.NATSTLS = true })
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{Labels: map[string]string{"env": "prod"}, Uses: 2})
	if !strings.Contains(tok.JoinCommand, "fleet-agent join --gateway "+gw.APIURL()+" --ca_pin "+gw.APICAPin()+" --token_file -") || strings.Contains(tok.JoinCommand, tok.Token) ||
		tok.InstallCommand != strings.Replace(tok.JoinCommand, " join ", " install ", 1) || tok.CAPin != gw.APICAPin() || !protocol.ValidCAPin(tok.CAPin) {
		t.Errorf("token create answer %+v: want the ready join and install commands with the gateway URL and pin", tok)
	}
	kp := newUser(t)
	resp, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, time.Now()))
	if code != "" {
		t.Fatalf("enrol: %s", code)
	}
	if resp.Host != "web-1" || resp.Labels["env"] != "prod" || len(resp.NATSURLs) != 1 || !strings.HasPrefix(resp.NATSURLs[0], "tls://") ||
		!strings.Contains(resp.NATSCA, "BEGIN CERTIFICATE") || resp.SigningKeys == nil || time.Until(resp.Expires) < 700*time.Hour {
		t.Errorf("enrol answer %+v", resp)
	}
	rec, err := gw.Agent(context.Background(), "web-1")
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	if rec.PublicKey != pub || rec.TokenID != tok.Info.ID || rec.Facts.OS != "linux" || rec.Labels["env"] != "prod" {
		t.Errorf("record %+v", rec)
	}
	nc := agentConn(t, gw, "web-1", kp, resp)
	if !nc.IsConnected() {
		t.Fatal("the enrolled credential does not connect")
	}
	// The same join again (same key, same name) succeeds and keeps the
	// name without spending the use left (it is the retry of a join
	// whose answer was lost); another host's join then spends it.
	if resp2, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, time.Now())); code != "" || resp2.Host != "web-1" {
		t.Fatalf("the same join again: %s %+v", code, resp2)
	}
	if ti := c.tokenInfo(tok.Info.ID); ti.Used != 1 || ti.State != protocol.TokenActive {
		t.Errorf("token after the same join twice: %+v", ti)
	}
	if _, code := c.enrol(enrolReq(t, newUser(t), tok.Token, "web-2", c.pin, time.Now())); code != "" {
		t.Fatalf("a second host: %s", code)
	}
	if ti := c.tokenInfo(tok.Info.ID); ti.Used != 2 || ti.State != protocol.TokenSpent {
		t.Errorf("token after two hosts: %+v", ti)
	}
}

// Every refusal of an enrolment has its own code, and a refusal after a
// use was consumed gives the use back.
func TestEnrolRefusals(t *testing.T) {
	clock := &testClock{t: time.Now()}
	gw := startAPIGateway(t, clock, nil)
	c := newAPIClient(t, gw)
	now := time.Now
	enrolOK := func(token, host string) nkeys.KeyPair {
		t.Helper()
		kp := newUser(t)
		if _, code := c.enrol(enrolReq(t, kp, token, host, c.pin, now())); code != "" {
			t.Fatalf("enrol %s: %s", host, code)
		}
		return kp
	}
	many := c.createToken(protocol.TokenCreateRequest{Uses: 50})
	expiring := c.createToken(protocol.TokenCreateRequest{TTL: "10m", Uses: 5})
	once := c.createToken(protocol.TokenCreateRequest{})
	enrolOK(once.Token, "spender")
	revoked := c.createToken(protocol.TokenCreateRequest{Uses: 5})
	if _, aerr := c.do(http.MethodDelete, protocol.AdminTokensPath+"/"+revoked.Info.ID, nil, nil); aerr != nil {
		t.Fatal(aerr)
	}
	named := c.createToken(protocol.TokenCreateRequest{Name: "web-1", Uses: 5})
	pattern := c.createToken(protocol.TokenCreateRequest{NamePattern: "web-*", Uses: 5})
	enrolOK(many.Token, "taken")
	gone := enrolOK(many.Token, "gone")
	if err := gw.RevokeAgent(context.Background(), "gone", "test"); err != nil {
		t.Fatal(err)
	}
	replacing := c.createToken(protocol.TokenCreateRequest{Name: "gone", Replace: "gone"})
	unknownID, _, unknown := protocol.NewJoinToken()
	_ = unknownID
	// The real id of a token with another secret is unknown too.
	id, _, _ := protocol.ParseJoinToken(many.Token)
	_, _, other := protocol.NewJoinToken()
	forged := protocol.TokenPrefix + "." + id + "." + strings.Split(other, ".")[2]
	otherCA, err := natsauth.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		req  func() *protocol.EnrolRequest
		want protocol.APICode
	}{
		{"unknown token", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), unknown, "h1", c.pin, now()) }, protocol.APITokenUnknown},
		{"known id, wrong secret", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), forged, "h1", c.pin, now()) }, protocol.APITokenUnknown},
		{"spent token", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), once.Token, "h2", c.pin, now()) }, protocol.APITokenSpent},
		{"revoked token", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), revoked.Token, "h3", c.pin, now()) }, protocol.APITokenRevoked},
		{"named token, other name", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), named.Token, "web-2", c.pin, now()) }, protocol.APINameNotAllowed},
		{"pattern, name outside it", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), pattern.Token, "db-1", c.pin, now()) }, protocol.APINameNotAllowed},
		{"pattern, no name", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), pattern.Token, "", c.pin, now()) }, protocol.APINameNotAllowed},
		{"any name, no name", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), many.Token, "", c.pin, now()) }, protocol.APINameNotAllowed},
		{"invalid name", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), many.Token, "a.b", c.pin, now()) }, protocol.APINameNotAllowed},
		{"name taken", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), many.Token, "taken", c.pin, now()) }, protocol.APINameTaken},
		{"host revoked", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), many.Token, "gone", c.pin, now()) }, protocol.APIHostRevoked},
		{"revoked key, replacing token", func() *protocol.EnrolRequest { return enrolReq(t, gone, replacing.Token, "gone", c.pin, now()) }, protocol.APIKeyRevoked},
		{"clock behind", func() *protocol.EnrolRequest {
			return enrolReq(t, newUser(t), many.Token, "h4", c.pin, now().Add(-protocol.MaxClockSkew-time.Minute))
		}, protocol.APIClockSkew},
		{"clock ahead", func() *protocol.EnrolRequest {
			return enrolReq(t, newUser(t), many.Token, "h4", c.pin, now().Add(protocol.MaxClockSkew+time.Minute))
		}, protocol.APIClockSkew},
		{"wrong CA pin", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), many.Token, "h5", otherCA.Pin(), now()) }, protocol.APIWrongCA},
		{"malformed CA pin", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), many.Token, "h5", "sha256:abc", now()) }, protocol.APIBadRequest},
		{"signature over other bytes", func() *protocol.EnrolRequest {
			kp := newUser(t)
			r := enrolReq(t, kp, many.Token, "h6", c.pin, now())
			other := *r
			other.Host = "h7"
			sig, _ := kp.Sign(other.SigningBytes())
			r.Signature = base64.RawURLEncoding.EncodeToString(sig)
			return r
		}, protocol.APIBadSignature},
		{"name changed after signing", func() *protocol.EnrolRequest {
			r := enrolReq(t, newUser(t), many.Token, "h8", c.pin, now())
			r.Host = "h9"
			return r
		}, protocol.APIBadSignature},
		{"key swapped in the middle", func() *protocol.EnrolRequest {
			r := enrolReq(t, newUser(t), many.Token, "h10", c.pin, now())
			r.PublicKey, _ = newUser(t).PublicKey()
			return r
		}, protocol.APIBadSignature},
		{"signature not base64url", func() *protocol.EnrolRequest {
			r := enrolReq(t, newUser(t), many.Token, "h11", c.pin, now())
			r.Signature = "%%%"
			return r
		}, protocol.APIBadSignature},
		{"no signature", func() *protocol.EnrolRequest {
			r := enrolReq(t, newUser(t), many.Token, "h11", c.pin, now())
			r.Signature = ""
			return r
		}, protocol.APIBadSignature},
		{"account key instead of a user key", func() *protocol.EnrolRequest {
			kp, _ := nkeys.CreateAccount()
			return enrolReq(t, kp, many.Token, "h12", c.pin, now())
		}, protocol.APIBadRequest},
		{"short nonce", func() *protocol.EnrolRequest {
			kp := newUser(t)
			r := enrolReq(t, kp, many.Token, "h13", c.pin, now())
			r.Nonce = "abc"
			sig, _ := kp.Sign(r.SigningBytes())
			r.Signature = base64.RawURLEncoding.EncodeToString(sig)
			return r
		}, protocol.APIBadRequest},
		{"not a token", func() *protocol.EnrolRequest { return enrolReq(t, newUser(t), "fmcp_abc", "h14", c.pin, now()) }, protocol.APIBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := c.tokenInfo(many.Info.ID).Used
			if _, code := c.enrol(tc.req()); code != tc.want {
				t.Errorf("code %q, want %q", code, tc.want)
			}
			if after := c.tokenInfo(many.Info.ID).Used; after != before {
				t.Errorf("a refused enrolment spent a use: %d, then %d", before, after)
			}
		})
	}

	t.Run("replayed", func(t *testing.T) {
		r := enrolReq(t, newUser(t), many.Token, "replay-1", c.pin, now())
		if _, code := c.enrol(r); code != "" {
			t.Fatalf("first: %s", code)
		}
		if _, code := c.enrol(r); code != protocol.APIReplayed {
			t.Errorf("the same request again: %q, want replayed", code)
		}
	})
	t.Run("replacing token takes a revoked name", func(t *testing.T) {
		resp, code := c.enrol(enrolReq(t, newUser(t), replacing.Token, "", c.pin, now()))
		if code != "" || resp.Host != "gone" {
			t.Fatalf("replace: %s %+v", code, resp)
		}
		if rec, _ := gw.Agent(context.Background(), "gone"); rec.Revoked() || len(rec.RevokedKeys) != 1 {
			t.Errorf("record after the replacement: %+v", rec)
		}
	})
	t.Run("named token without a name", func(t *testing.T) {
		if resp, code := c.enrol(enrolReq(t, newUser(t), named.Token, "", c.pin, now())); code != "" || resp.Host != "web-1" {
			t.Errorf("%s %+v", code, resp)
		}
	})
	t.Run("pattern, matching name", func(t *testing.T) {
		if resp, code := c.enrol(enrolReq(t, newUser(t), pattern.Token, "web-7", c.pin, now())); code != "" || resp.Host != "web-7" {
			t.Errorf("%s %+v", code, resp)
		}
	})
	t.Run("expired token", func(t *testing.T) {
		clock.advance(11 * time.Minute)
		defer clock.advance(-11 * time.Minute)
		// The request is dated by the gateway's clock.
		if _, code := c.enrol(enrolReq(t, newUser(t), expiring.Token, "h20", c.pin, clock.now())); code != protocol.APITokenExpired {
			t.Errorf("code %q, want token_expired", code)
		}
	})
}

// agentConn connects to the gateway's NATS server as the agent of host
// with the enrolment's credential, as agents do.
func agentConn(t *testing.T, gw *Gateway, host string, kp nkeys.KeyPair, resp protocol.EnrolResponse) *nats.Conn {
	t.Helper()
	seed, _ := kp.Seed()
	return connectAgent(t, gw, host, resp.JWT, seed, []byte(resp.NATSCA))
}

// TestEnrolTakesTheMachineName: a host that joins without --name, with a
// token that does not name it, gets its machine's name (the first label,
// in lowercase) when that is a valid host name; a pattern still applies,
// and a machine name that is not a host name asks for --name.
func TestEnrolTakesTheMachineName(t *testing.T) {
	gw := startAPIGateway(t, &testClock{t: time.Now()}, nil)
	c := newAPIClient(t, gw)
	many := c.createToken(protocol.TokenCreateRequest{Uses: 5})
	pattern := c.createToken(protocol.TokenCreateRequest{NamePattern: "db-*", Uses: 5})
	req := func(token, hostname string) *protocol.EnrolRequest {
		r := &protocol.EnrolRequest{Token: token, CAPin: c.pin, Facts: protocol.AgentFacts{OS: "linux", Arch: "amd64", Hostname: hostname}}
		signProof(t, newUser(t), &r.Proof, time.Now(), r.SigningBytes)
		return r
	}
	resp, code := c.enrol(req(many.Token, "Web-7.example.com"))
	if code != "" || resp.Host != "web-7" {
		t.Fatalf("enrol of machine Web-7.example.com without a name: %v, %q; want host web-7", resp, code)
	}
	for _, tc := range []struct{ token, hostname string }{
		{pattern.Token, "web-8"},
		{many.Token, "-dash.example.com"},
		{many.Token, ""},
	} {
		if _, code := c.enrol(req(tc.token, tc.hostname)); code != protocol.APINameNotAllowed {
			t.Errorf("enrol of machine %q without a name: %q, want %s", tc.hostname, code, protocol.APINameNotAllowed)
		}
	}
}

// TestEnrolForgedToken: a join token written into the bucket by anyone
// but a gateway of the fleet (any user of the fleet's NATS account can
// write it) is not a token: its seal does not hold, so it enrols nothing.
func TestEnrolForgedToken(t *testing.T) {
	gw := startAPIGateway(t, &testClock{t: time.Now()}, nil)
	c := newAPIClient(t, gw)
	id, secret, token := protocol.NewJoinToken()
	sum := sha256.Sum256(secret)
	now := time.Now()
	data, _ := json.Marshal(storedToken{ID: id, SecretSHA256: hex.EncodeToString(sum[:]), Labels: map[string]string{"env": "prod"},
		Uses: 5, CreatedAt: now, ExpiresAt: now.Add(time.Hour)})
	js, err := jetstream.New(gw.conns.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, protocol.TokensBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, id, data); err != nil {
		t.Fatal(err)
	}
	if _, code := c.enrol(enrolReq(t, newUser(t), token, "forger-1", c.pin, now)); code == "" {
		t.Fatal("a forged join token enrolled a host")
	}
	if _, err := gw.Agent(ctx, "forger-1"); err == nil {
		t.Error("the forged token's host has a record")
	}
	// The same record sealed with the fleet's key but written by hand
	// names no revision it is stored at: refused too.
	id2, secret2, token2 := protocol.NewJoinToken()
	sum2 := sha256.Sum256(secret2)
	rec2 := storedToken{ID: id2, SecretSHA256: hex.EncodeToString(sum2[:]), Uses: 5, CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	sealed, err := gw.subsys.seal.seal("token", id2, rec2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, id2, sealed); err != nil {
		t.Fatal(err)
	}
	if _, code := c.enrol(enrolReq(t, newUser(t), token2, "web-0", c.pin, now)); code != protocol.APITokenRevoked {
		t.Errorf("a sealed token written by hand: %q, want %s", code, protocol.APITokenRevoked)
	}
	// Written by the token store, a token is one: only the seal and the
	// revision were missing.
	rec3, err := gw.CreateJoinToken(ctx, &protocol.TokenCreateRequest{Uses: 5}, "ops")
	if err != nil {
		t.Fatal(err)
	}
	if _, code := c.enrol(enrolReq(t, newUser(t), rec3.Token, "web-1", c.pin, now)); code != "" {
		t.Errorf("the sealed token: %s", code)
	}
}

// TestEnrolTokenPutBack: an old sealed copy of a one-use token's record,
// saved before its use and put back after it (any user of the fleet's
// NATS account can), does not give the use back: the token is refused
// for good and listed as tampered; revoking it writes it again, revoked.
func TestEnrolTokenPutBack(t *testing.T) {
	gw := startAPIGateway(t, &testClock{t: time.Now()}, nil)
	c := newAPIClient(t, gw)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := gw.CreateJoinToken(ctx, &protocol.TokenCreateRequest{}, "ops")
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Info.ID
	js, err := jetstream.New(gw.conns.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, protocol.TokensBucket)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := kv.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, code := c.enrol(enrolReq(t, newUser(t), resp.Token, "web-1", c.pin, now)); code != "" {
		t.Fatalf("the first use: %s", code)
	}
	if _, code := c.enrol(enrolReq(t, newUser(t), resp.Token, "web-2", c.pin, now)); code != protocol.APITokenSpent {
		t.Fatalf("a second use before the copy is put back: %q, want %s", code, protocol.APITokenSpent)
	}
	if _, err := kv.Put(ctx, id, saved.Value()); err != nil {
		t.Fatal(err)
	}
	_, aerr := c.do(http.MethodPost, protocol.EnrolPath, enrolReq(t, newUser(t), resp.Token, "web-3", c.pin, now), &protocol.EnrolResponse{})
	if aerr == nil || aerr.Code != protocol.APITokenRevoked || !strings.Contains(aerr.Message, "put back") {
		t.Errorf("a use after the old copy was put back: %v; want %s saying it was put back", aerr, protocol.APITokenRevoked)
	}
	if _, err := gw.Agent(ctx, "web-3"); err == nil {
		t.Error("the put-back token enrolled web-3")
	}
	list, err := gw.JoinTokens(ctx)
	if err != nil || len(list) != 1 || list[0].State != protocol.TokenTampered {
		t.Errorf("the token list: %+v, %v; want the token tampered", list, err)
	}
	if _, _, err := gw.subsys.enrol.RevokeJoinToken(ctx, id, "ops"); err != nil {
		t.Fatalf("revoking the put-back token: %v", err)
	}
	if list, err := gw.JoinTokens(ctx); err != nil || len(list) != 1 || list[0].State != protocol.TokenRevoked {
		t.Errorf("the token list after its revocation: %+v, %v", list, err)
	}
}

// storedToken is a join token's record as the tokens' bucket holds it
// (gateway/enrol), for records written by hand.
type storedToken struct {
	ID           string            `json:"id"`
	SecretSHA256 string            `json:"secret_sha256"`
	Labels       map[string]string `json:"labels,omitempty"`
	Uses         int               `json:"uses"`
	Used         int               `json:"used"`
	CreatedAt    time.Time         `json:"created_at"`
	ExpiresAt    time.Time         `json:"expires_at"`
}
