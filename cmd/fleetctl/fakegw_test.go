package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// testCA is a CA made for a test, as the gateway's fleet CA is.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pin  string
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pin: protocol.CAPin(cert)}
}

// pemFile writes the CA's certificate into a file and returns its path.
func (ca *testCA) pemFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// serverCert issues a server certificate for names (DNS names or IP
// addresses) and returns it with the CA in its chain, as the gateway
// presents it.
func (ca *testCA) serverCert(t *testing.T, names ...string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "fleet API"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key}
}

// Tokens the fake gateway knows: an admin's and a caller's without admin.
const (
	adminToken = "fmcp_admin-secret"
	userToken  = "fmcp_user-secret"
)

// request is what fleetctl sent the fake gateway.
type request struct {
	Method, Path, Query, Auth, ContentType string
	Body                                   []byte
}

// fakeGateway implements the admin API contract (protocol/admin.go) over
// an in-memory fleet, and records every request that reaches it.
type fakeGateway struct {
	t   *testing.T
	srv *httptest.Server
	ca  *testCA

	mu       sync.Mutex
	requests []request
	tokens   map[string]*protocol.TokenInfo
	agents   map[string]*protocol.AgentInfo
	skills   fakeSkills
	lastBody []byte // the body of the last answer
}

// startFakeGateway serves the admin API over TLS with a certificate from
// a new CA for 127.0.0.1 and localhost.
func startFakeGateway(t *testing.T) *fakeGateway {
	t.Helper()
	ca := newTestCA(t, "fleet CA")
	return startFakeGatewayWith(t, ca, ca.serverCert(t, "127.0.0.1", "localhost"))
}

func startFakeGatewayWith(t *testing.T, ca *testCA, cert tls.Certificate) *fakeGateway {
	t.Helper()
	g := &fakeGateway{t: t, ca: ca, tokens: map[string]*protocol.TokenInfo{}, agents: map[string]*protocol.AgentInfo{}}
	g.seed()
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.AdminTokensPath, g.createToken)
	mux.HandleFunc("GET "+protocol.AdminTokensPath, g.listTokens)
	mux.HandleFunc("DELETE "+protocol.AdminTokensPath+"/{id}", g.revokeToken)
	mux.HandleFunc("GET "+protocol.AdminAgentsPath, g.listAgents)
	mux.HandleFunc("POST "+protocol.AdminAgentsPath+"/{name}/{action}", g.agentAction)
	mux.HandleFunc("POST "+protocol.AdminKeysPath+"/{key}/revoke", g.revokeKey)
	mux.HandleFunc("GET "+protocol.AdminAuditPath, g.audit)
	g.skillRoutes(mux)
	g.srv = httptest.NewUnstartedServer(g.record(mux))
	g.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	g.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are what some tests are about
	g.srv.StartTLS()
	t.Cleanup(g.srv.Close)
	return g
}

// url is the fake gateway's address, as --gateway takes it.
func (g *fakeGateway) url() string { return g.srv.URL }

func (g *fakeGateway) seed() {
	created := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	g.tokens["aaaaaaaaaa"] = &protocol.TokenInfo{ID: "aaaaaaaaaa", State: protocol.TokenActive, Labels: map[string]string{"env": "prod", "role": "web"},
		NamePattern: "web-*", Uses: 5, Used: 2, CreatedAt: created, CreatedBy: "alice@example.com", ExpiresAt: created.Add(48 * time.Hour)}
	g.tokens["bbbbbbbbbb"] = &protocol.TokenInfo{ID: "bbbbbbbbbb", State: protocol.TokenSpent, Name: "db-1", Replace: "db-1",
		Uses: 1, Used: 1, CreatedAt: created.Add(time.Hour), CreatedBy: "ci", ExpiresAt: created.Add(2 * time.Hour)}
	g.agents["web-1"] = &protocol.AgentInfo{Host: "web-1", PublicKey: "UAWEB1", Labels: map[string]string{"env": "prod"},
		Facts: protocol.AgentFacts{OS: "linux", Arch: "amd64"}, TokenID: "aaaaaaaaaa", EnrolledAt: created,
		CredentialExpiresAt: created.Add(30 * 24 * time.Hour), Online: true}
	g.agents["db-1"] = &protocol.AgentInfo{Host: "db-1", PublicKey: "UADB1", Facts: protocol.AgentFacts{OS: "linux", Arch: "arm64"},
		EnrolledAt: created, CredentialExpiresAt: created.Add(24 * time.Hour), RevokedAt: created.Add(2 * time.Hour), RevokedBy: "alice@example.com"}
}

// record keeps every request and checks the bearer token before the API
// sees it.
func (g *fakeGateway) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 32<<20)) // a skill push is larger than other requests
		g.mu.Lock()
		g.requests = append(g.requests, request{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Auth: r.Header.Get("Authorization"),
			ContentType: r.Header.Get("Content-Type"), Body: body})
		g.mu.Unlock()
		r.Body = io.NopCloser(strings.NewReader(string(body)))
		switch r.Header.Get("Authorization") {
		case "Bearer " + adminToken:
			next.ServeHTTP(w, r)
		case "Bearer " + userToken:
			g.fail(w, http.StatusForbidden, protocol.APIForbidden, "the admin API is for admins; your token is not one")
		default:
			w.Header().Set("WWW-Authenticate", `Bearer realm="fleet"`)
			g.fail(w, http.StatusUnauthorized, protocol.APIUnauthorized, "no valid bearer token")
		}
	})
}

// sent returns the requests that reached the fake gateway.
func (g *fakeGateway) sent() []request {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]request(nil), g.requests...)
}

// last returns the one request fleetctl sent.
func (g *fakeGateway) last() request {
	g.t.Helper()
	reqs := g.sent()
	if len(reqs) != 1 {
		g.t.Fatalf("fleetctl sent %d requests; want 1: %+v", len(reqs), reqs)
	}
	return reqs[0]
}

func (g *fakeGateway) answer(w http.ResponseWriter, status int, v any) {
	data, _ := json.Marshal(v)
	g.mu.Lock()
	g.lastBody = data
	g.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

func (g *fakeGateway) answered() []byte {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastBody
}

func (g *fakeGateway) fail(w http.ResponseWriter, status int, code protocol.APICode, msg string) {
	g.answer(w, status, &protocol.APIError{Code: code, Message: msg})
}

// decode reads a request body strictly, as the gateway does.
func (g *fakeGateway) decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		g.fail(w, http.StatusBadRequest, protocol.APIBadRequest, "bad body: "+err.Error())
		return false
	}
	return true
}

func (g *fakeGateway) createToken(w http.ResponseWriter, r *http.Request) {
	var req protocol.TokenCreateRequest
	if !g.decode(w, r, &req) {
		return
	}
	ttl, err := time.ParseDuration(req.TTL)
	if err != nil || ttl <= 0 || ttl > 30*24*time.Hour {
		g.fail(w, http.StatusBadRequest, protocol.APIBadRequest, "ttl "+req.TTL+": want a duration up to 720h")
		return
	}
	if req.Uses == 0 {
		req.Uses = 1
	}
	id, _, token := protocol.NewJoinToken()
	now := time.Now().UTC()
	info := protocol.TokenInfo{ID: id, State: protocol.TokenActive, Labels: req.Labels, Name: req.Name, NamePattern: req.NamePattern,
		Replace: req.Replace, Uses: req.Uses, CreatedAt: now, CreatedBy: "admin", ExpiresAt: now.Add(ttl)}
	g.mu.Lock()
	g.tokens[id] = &info
	g.mu.Unlock()
	gw := "https://" + g.srv.Listener.Addr().String()
	resp := &protocol.TokenCreateResponse{Token: token, Info: info, GatewayURL: gw, CAPin: g.ca.pin}
	resp.JoinCommand, resp.InstallCommand = protocol.JoinCommands(resp)
	g.answer(w, http.StatusCreated, resp)
}

func (g *fakeGateway) listTokens(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	var list protocol.TokenList
	for _, t := range g.tokens {
		list.Tokens = append(list.Tokens, *t)
	}
	g.mu.Unlock()
	g.answer(w, http.StatusOK, &list)
}

func (g *fakeGateway) revokeToken(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	var t *protocol.TokenInfo
	if rec := g.tokens[r.PathValue("id")]; rec != nil {
		rec.State, rec.RevokedAt, rec.RevokedBy = protocol.TokenRevoked, time.Now().UTC(), "admin"
		cp := *rec
		t = &cp
	}
	g.mu.Unlock()
	if t == nil {
		g.fail(w, http.StatusNotFound, protocol.APINotFound, "no join token "+r.PathValue("id"))
		return
	}
	g.answer(w, http.StatusOK, t)
}

func (g *fakeGateway) listAgents(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	var list protocol.AgentList
	for _, a := range g.agents {
		list.Agents = append(list.Agents, *a)
	}
	g.mu.Unlock()
	g.answer(w, http.StatusOK, &list)
}

// revokeKey revokes the key of a host it knows, and any other key.
func (g *fakeGateway) revokeKey(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	resp := protocol.KeyRevokeResponse{Key: key}
	g.mu.Lock()
	for _, a := range g.agents {
		if a.PublicKey == key {
			a.RevokedAt, a.RevokedBy, a.Online = time.Now().UTC(), "admin", false
			resp.Host = a.Host
		}
	}
	g.mu.Unlock()
	g.answer(w, http.StatusOK, &resp)
}

func (g *fakeGateway) agentAction(w http.ResponseWriter, r *http.Request) {
	name, action := r.PathValue("name"), r.PathValue("action")
	var labels protocol.LabelsRequest
	var recovery protocol.AllowRecoveryRequest
	switch action {
	case "revoke":
	case "labels":
		if !g.decode(w, r, &labels) {
			return
		}
	case "allow-recovery":
		if !g.decode(w, r, &recovery) {
			return
		}
	default:
		http.NotFound(w, r)
		return
	}
	g.mu.Lock()
	var a *protocol.AgentInfo
	if rec := g.agents[name]; rec != nil {
		a = rec
		switch action {
		case "revoke":
			a.RevokedAt, a.RevokedBy, a.Online = time.Now().UTC(), "admin", false
		case "labels":
			if a.Labels == nil {
				a.Labels = map[string]string{}
			}
			for k, v := range labels.Set {
				a.Labels[k] = v
			}
			for _, k := range labels.Remove {
				delete(a.Labels, k)
			}
		case "allow-recovery":
			a.RecoveriesLeft += max(recovery.Count, 1)
		}
		cp := *a
		cp.Labels = maps.Clone(a.Labels)
		a = &cp
	}
	g.mu.Unlock()
	if a == nil {
		g.fail(w, http.StatusNotFound, protocol.APIUnknownHost, "no enrolled host "+name)
		return
	}
	g.answer(w, http.StatusOK, a)
}
