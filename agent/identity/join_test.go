package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// testCA is a certificate authority made for a test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

var serial atomic.Int64

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key}
}

func (ca *testCA) pin() string { return protocol.CAPin(ca.cert) }

func (ca *testCA) pem() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}))
}

// leaf issues a server certificate for names (DNS names or IPs), valid
// from notBefore to notAfter, with chain appended to what the server
// presents.
func (ca *testCA) leaf(t *testing.T, names []string, notBefore, notAfter time.Time, chain ...*x509.Certificate) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
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
	c := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	for _, x := range chain {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}

// fakeGateway is the fleet API as the contract describes it, checking
// every request the way the gateway must.
type fakeGateway struct {
	t       *testing.T
	srv     *httptest.Server
	pin     string
	token   string
	account nkeys.KeyPair
	natsCA  string

	mu       sync.Mutex
	requests int
	nonces   map[string]bool
	keys     map[string]string // host -> public key enrolled
	refuse   protocol.APICode  // answer every request with this code
	recovery int               // recoveries allowed
	lastReq  protocol.EnrolRequest
	issued   int
}

// newFakeGateway serves the fleet API with a leaf of ca for 127.0.0.1
// and localhost, the pin being ca's.
func newFakeGateway(t *testing.T, ca *testCA) *fakeGateway {
	t.Helper()
	cert := ca.leaf(t, []string{"127.0.0.1", "localhost"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), ca.cert)
	return newFakeGatewayCert(t, ca.pin(), cert)
}

func newFakeGatewayCert(t *testing.T, pin string, cert tls.Certificate) *fakeGateway {
	t.Helper()
	_, _, token := protocol.NewJoinToken()
	acc, _ := nkeys.CreateAccount()
	g := &fakeGateway{t: t, pin: pin, token: token, account: acc, nonces: map[string]bool{}, keys: map[string]string{}}
	natsCA := newCA(t, "nats")
	g.natsCA = natsCA.pem()
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.EnrolPath, g.enrol)
	mux.HandleFunc("POST "+protocol.RecoverPath, g.recover)
	g.srv = httptest.NewUnstartedServer(mux)
	g.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	g.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	g.srv.StartTLS()
	t.Cleanup(g.srv.Close)
	return g
}

func (g *fakeGateway) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.requests
}

func writeAPIError(w http.ResponseWriter, status int, code protocol.APICode, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(&protocol.APIError{Code: code, Message: msg})
}

// checkProof checks a request's proof of possession as the gateway does:
// the signature over signing by the key, a fresh nonce, the time.
func (g *fakeGateway) checkProof(p *protocol.Proof, signing []byte) (protocol.APICode, string) {
	kp, err := nkeys.FromPublicKey(p.PublicKey)
	if err != nil || !nkeys.IsValidPublicUserKey(p.PublicKey) {
		return protocol.APIBadRequest, "public_key is not a user key"
	}
	sig, err := base64.RawURLEncoding.DecodeString(p.Signature)
	if err != nil || kp.Verify(signing, sig) != nil {
		return protocol.APIBadSignature, "the signature does not verify"
	}
	if err := protocol.CheckNonce(p.Nonce); err != nil {
		return protocol.APIBadRequest, err.Error()
	}
	if g.nonces[p.Nonce] {
		return protocol.APIReplayed, "nonce seen before"
	}
	g.nonces[p.Nonce] = true
	if err := p.CheckTime(time.Now()); err != nil {
		return protocol.APIClockSkew, err.Error()
	}
	return "", ""
}

func (g *fakeGateway) answer(w http.ResponseWriter, host, pub string) {
	uc := jwt.NewUserClaims(pub)
	uc.Name = host
	uc.Expires = time.Now().Add(30 * 24 * time.Hour).Unix()
	g.issued++
	uc.Tags.Add(fmt.Sprintf("n%d", g.issued)) // every credential differs
	token, err := uc.Encode(g.account)
	if err != nil {
		g.t.Error(err)
	}
	_ = json.NewEncoder(w).Encode(&protocol.EnrolResponse{Host: host, JWT: token, Expires: time.Unix(uc.Expires, 0),
		NATSURLs: []string{"tls://127.0.0.1:4222"}, NATSCA: g.natsCA, Labels: map[string]string{"env": "prod"}, SigningKeys: []string{}})
}

func (g *fakeGateway) enrol(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.requests++
	var req protocol.EnrolRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, protocol.MaxAPIRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeAPIError(w, 400, protocol.APIBadRequest, err.Error())
		return
	}
	g.lastReq = req
	if code, msg := g.checkProof(&req.Proof, req.SigningBytes()); code != "" {
		writeAPIError(w, 400, code, msg)
		return
	}
	if req.CAPin != g.pin {
		writeAPIError(w, 400, protocol.APIWrongCA, "not this gateway's CA")
		return
	}
	if g.refuse != "" {
		writeAPIError(w, 403, g.refuse, "refused as the test asked")
		return
	}
	if req.Token != g.token {
		writeAPIError(w, 403, protocol.APITokenUnknown, "no such token")
		return
	}
	host := req.Host
	if host == "" {
		host = "from-token"
	}
	if k, ok := g.keys[host]; ok && k != req.PublicKey {
		writeAPIError(w, 409, protocol.APINameTaken, "host "+host+" is enrolled with another key")
		return
	}
	g.keys[host] = req.PublicKey
	g.answer(w, host, req.PublicKey)
}

func (g *fakeGateway) recover(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.requests++
	var req protocol.RecoverRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeAPIError(w, 400, protocol.APIBadRequest, err.Error())
		return
	}
	if code, msg := g.checkProof(&req.Proof, req.SigningBytes()); code != "" {
		writeAPIError(w, 400, code, msg)
		return
	}
	if g.keys[req.Host] != req.PublicKey {
		writeAPIError(w, 404, protocol.APIUnknownHost, "no such host with this key")
		return
	}
	if g.recovery == 0 {
		writeAPIError(w, 403, protocol.APINoRecovery, "no recovery allowed for "+req.Host)
		return
	}
	g.recovery--
	g.answer(w, req.Host, req.PublicKey)
}

func (g *fakeGateway) opts(state string) JoinOptions {
	return JoinOptions{GatewayURL: g.srv.URL, Token: g.token, CAPin: g.pin, Host: "web-1", StateDir: state}
}

// A join against the fleet API stores an identity that loads: the key
// made on the host, the credential for it and host, the enrolment; the
// request the gateway saw carries a proof that verifies and the facts.
func TestJoin(t *testing.T) {
	g := newFakeGateway(t, newCA(t, "fleet"))
	state := t.TempDir()
	id, enrolled, err := Join(context.Background(), g.opts(state))
	if err != nil || !enrolled {
		t.Fatalf("Join: %v (enrolled %v)", err, enrolled)
	}
	e := id.Enrolment
	if e.Host != "web-1" || e.GatewayURL != g.srv.URL || e.CAPin != g.pin || e.NATSCA != g.natsCA || e.Labels["env"] != "prod" || e.Expires.IsZero() {
		t.Errorf("enrolment %+v", e)
	}
	if g.lastReq.PublicKey != id.PublicKey || g.lastReq.Facts.OS == "" || g.lastReq.Facts.Arch == "" || g.lastReq.Facts.Hostname == "" {
		t.Errorf("the request: %+v", g.lastReq)
	}
	seed, _ := os.ReadFile(filepath.Join(state, Dir, KeyFile))
	body, _ := json.Marshal(g.lastReq)
	if strings.Contains(string(body), strings.TrimSpace(string(seed))) {
		t.Error("the request carries the seed")
	}
	again, err := Load(state)
	if err != nil || again.PublicKey != id.PublicKey {
		t.Fatalf("Load after join: %v", err)
	}
	for _, name := range []string{KeyFile, JWTFile, EnrolmentFile} {
		if fi, err := os.Stat(filepath.Join(state, Dir, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v %v", name, err, fi)
		}
	}

	// A second join with this gateway sends nothing and keeps the identity.
	n := g.count()
	id2, enrolled, err := Join(context.Background(), g.opts(state))
	if err != nil || enrolled || id2.PublicKey != id.PublicKey || g.count() != n {
		t.Fatalf("second join: %v, enrolled %v, requests %d -> %d", err, enrolled, n, g.count())
	}
	// Without --name too; with another name, or another gateway, it is
	// refused and says why.
	o := g.opts(state)
	o.Host = ""
	if _, enrolled, err := Join(context.Background(), o); err != nil || enrolled {
		t.Errorf("second join without --name: %v %v", err, enrolled)
	}
	o.Host = "web-2"
	if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), `enrolled as "web-1"`) {
		t.Errorf("second join as web-2: %v", err)
	}
	o = g.opts(state)
	o.CAPin = newCA(t, "other").pin()
	if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), "to move this host to another fleet") {
		t.Errorf("join with another CA: %v", err)
	}
	if g.count() != n {
		t.Errorf("the refused joins sent %d requests", g.count()-n)
	}

	// An interrupted join (key, no credential) joins again with the same
	// key, which the gateway accepts for the same name.
	if err := os.Remove(filepath.Join(state, Dir, JWTFile)); err != nil {
		t.Fatal(err)
	}
	id3, enrolled, err := Join(context.Background(), g.opts(state))
	if err != nil || !enrolled || id3.PublicKey != id.PublicKey {
		t.Fatalf("join after an interrupted one: %v, enrolled %v", err, enrolled)
	}
}

// Every refusal of the gateway reaches the caller as a *RefusedError with
// the gateway's code and advice saying what to do, and nothing is stored
// but the key.
func TestJoinRefused(t *testing.T) {
	g := newFakeGateway(t, newCA(t, "fleet"))
	advice := map[protocol.APICode]string{
		protocol.APITokenUnknown: "copied whole", protocol.APITokenExpired: "new token", protocol.APITokenSpent: "--uses",
		protocol.APITokenRevoked: "new one", protocol.APINameNotAllowed: "--name", protocol.APINameTaken: "--replace",
		protocol.APIHostRevoked: "--replace", protocol.APIKeyRevoked: "new key", protocol.APIClockSkew: "clock",
		protocol.APIReplayed: "try again", protocol.APIBadSignature: "upgrade", protocol.APIBadRequest: "upgrade",
		protocol.APIUnavailable: "later", protocol.APIWrongCA: "--ca_pin", protocol.APINoRecovery: "join with a new token",
		protocol.APIUnknownHost: "join", protocol.APINotFound: "--gateway",
	}
	for code, want := range advice {
		g.mu.Lock()
		g.refuse = code
		g.mu.Unlock()
		state := t.TempDir()
		_, _, err := Join(context.Background(), g.opts(state))
		var re *RefusedError
		var apiErr *protocol.APIError
		if !errors.As(err, &re) || !errors.As(err, &apiErr) || apiErr.Code != code || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want a refusal saying %q", code, err, want)
		}
		if _, err := Load(state); !errors.Is(err, ErrNotEnrolled) {
			t.Errorf("%s: a refused join left an identity: %v", code, err)
		}
	}
	// A token the gateway does not know, as the gateway decides it.
	g.mu.Lock()
	g.refuse = ""
	g.mu.Unlock()
	o := g.opts(t.TempDir())
	_, _, other := protocol.NewJoinToken()
	o.Token = other
	if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), string(protocol.APITokenUnknown)) {
		t.Errorf("unknown token: %v", err)
	}
	// Another key under a name taken.
	if _, _, err := Join(context.Background(), g.opts(t.TempDir())); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Join(context.Background(), g.opts(t.TempDir())); err == nil || !strings.Contains(err.Error(), "name_taken") {
		t.Errorf("a second machine as web-1: %v", err)
	}
}

// Bad options are refused before anything is made or sent.
func TestJoinRefusesBadOptions(t *testing.T) {
	g := newFakeGateway(t, newCA(t, "fleet"))
	httpURL := strings.Replace(g.srv.URL, "https://", "http://", 1)
	for _, tc := range []struct {
		name string
		edit func(*JoinOptions)
		want string
	}{
		{"http", func(o *JoinOptions) { o.GatewayURL = httpURL }, "plain http"},
		{"no scheme", func(o *JoinOptions) { o.GatewayURL = "gw.example:8443" }, "want https://"},
		{"path", func(o *JoinOptions) { o.GatewayURL = g.srv.URL + "/v1/enrol" }, "path"},
		{"user", func(o *JoinOptions) { o.GatewayURL = "https://u:p@gw.example" }, "user name"},
		{"bad port", func(o *JoinOptions) { o.GatewayURL = "https://gw.example:99999" }, "port"},
		{"token", func(o *JoinOptions) { o.Token = "fmcp1.abc.def" }, "not a join token"},
		{"pin", func(o *JoinOptions) { o.CAPin = "sha256:ABC" }, "--ca_pin"},
		{"upper-case pin", func(o *JoinOptions) { o.CAPin = strings.ToUpper(g.pin) }, "--ca_pin"},
		{"name", func(o *JoinOptions) { o.Host = "web.1" }, "--name"},
		{"state", func(o *JoinOptions) { o.StateDir = "" }, "state directory"},
	} {
		state := t.TempDir()
		o := g.opts(state)
		if tc.name != "state" {
			o.StateDir = state
		}
		tc.edit(&o)
		if _, _, err := Join(context.Background(), o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
		if entries, _ := os.ReadDir(state); len(entries) != 0 {
			t.Errorf("%s: the refused join wrote %v", tc.name, entries)
		}
	}
	if g.count() != 0 {
		t.Errorf("refused options sent %d requests", g.count())
	}
}

// The token goes only to a server whose certificate verifies, for the
// URL's host name and now, against the certificate of the pin in its
// chain: a server of another CA, a certificate for another name, an
// expired one, and a chain that shows the pinned CA without being signed
// by it are all refused in the TLS handshake, before the request.
func TestJoinPinsTheCA(t *testing.T) {
	fleet := newCA(t, "fleet")
	other := newCA(t, "other")
	inter := newIntermediate(t, fleet, "fleet-intermediate")
	now := time.Now()
	good := []string{"127.0.0.1", "localhost"}
	for _, tc := range []struct {
		name string
		cert tls.Certificate
		host string // the URL's host, default 127.0.0.1
		want string
	}{
		{"another CA", other.leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour)), "", "holds no CA certificate of the pin"},
		{"another CA presenting the fleet's", other.leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), fleet.cert), "", "does not verify"},
		{"another CA presenting the fleet's and its own", other.leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), other.cert, fleet.cert), "", "does not verify"},
		{"another host name", fleet.leaf(t, []string{"gw.example"}, now.Add(-time.Hour), now.Add(time.Hour), fleet.cert), "", "does not verify"},
		{"IP URL, name only for localhost", fleet.leaf(t, []string{"localhost"}, now.Add(-time.Hour), now.Add(time.Hour), fleet.cert), "", "does not verify"},
		{"expired", fleet.leaf(t, good, now.Add(-2*time.Hour), now.Add(-time.Hour), fleet.cert), "", "expired"},
		{"not yet valid", fleet.leaf(t, good, now.Add(time.Hour), now.Add(2*time.Hour), fleet.cert), "", "does not verify"},
		{"the fleet's CA not shown", fleet.leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour)), "", "holds no CA certificate of the pin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newFakeGatewayCert(t, fleet.pin(), tc.cert)
			o := g.opts(t.TempDir())
			_, _, err := Join(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v, want an error saying %q", err, tc.want)
			}
			if g.count() != 0 {
				t.Errorf("the request reached a server that failed the pin (%d requests)", g.count())
			}
		})
	}
	// The chains that pass: the CA shown after the leaf, under an
	// intermediate, and a name URL.
	for _, tc := range []struct {
		name string
		cert tls.Certificate
		host string
	}{
		{"CA after the leaf", fleet.leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), fleet.cert), ""},
		{"intermediate", inter.leaf(t, good, now.Add(-time.Hour), now.Add(time.Hour), inter.cert, fleet.cert), ""},
		{"localhost", fleet.leaf(t, []string{"localhost"}, now.Add(-time.Hour), now.Add(time.Hour), fleet.cert), "localhost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newFakeGatewayCert(t, fleet.pin(), tc.cert)
			o := g.opts(t.TempDir())
			if tc.host != "" {
				o.GatewayURL = strings.Replace(o.GatewayURL, "127.0.0.1", tc.host, 1)
			}
			if _, _, err := Join(context.Background(), o); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// newIntermediate makes a CA signed by parent.
func newIntermediate(t *testing.T, parent *testCA, name string) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent.cert, &key.PublicKey, parent.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key}
}

// A redirect is not followed: it would carry the token to a URL nobody
// pinned.
func TestJoinRefusesRedirects(t *testing.T) {
	fleet := newCA(t, "fleet")
	var hits atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	defer target.Close()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{fleet.leaf(t, []string{"127.0.0.1"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), fleet.cert)}}
	srv.StartTLS()
	defer srv.Close()
	_, _, token := protocol.NewJoinToken()
	_, _, err := Join(context.Background(), JoinOptions{GatewayURL: srv.URL, Token: token, CAPin: fleet.pin(), StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "redirect") || hits.Load() != 0 {
		t.Errorf("%v; the redirect target saw %d requests", err, hits.Load())
	}
}

// Recovery sends the pin of enrolment.json and a proof of the enrolled
// key; it replaces the credential when the gateway allows one, and says
// to join again when it does not.
func TestRecover(t *testing.T) {
	g := newFakeGateway(t, newCA(t, "fleet"))
	state := t.TempDir()
	id, _, err := Join(context.Background(), g.opts(state))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := id.JWT()
	_, err = Recover(context.Background(), state)
	var apiErr *protocol.APIError
	if !errors.As(err, &apiErr) || apiErr.Code != protocol.APINoRecovery || !strings.Contains(err.Error(), NoRecoveryAdvice) {
		t.Errorf("recovery not allowed: %v", err)
	}
	g.mu.Lock()
	g.recovery = 1
	g.mu.Unlock()
	id2, err := Recover(context.Background(), state)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := id2.JWT()
	if after == before {
		t.Error("the recovered credential is the old one")
	}
	if onDisk, _ := Open(state).LoadJWT(); onDisk != after {
		t.Error("the recovered credential was not stored")
	}
	// An agent enrolled in process has nowhere to recover from.
	local := t.TempDir()
	s := Open(local)
	kp, _ := s.LoadOrCreateKey()
	_ = s.SaveJWT(credential(t, kp, "dev-1", time.Now().Add(time.Hour)))
	_ = s.SaveEnrolment(&Enrolment{Host: "dev-1", NATSURLs: []string{"nats://127.0.0.1:4222"}})
	if _, err := Recover(context.Background(), local); !errors.Is(err, ErrNoGateway) {
		t.Errorf("in-process enrolment: %v", err)
	}
}

func TestParseGatewayURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://GW.example:8443": "https://gw.example:8443",
		"https://gw.example/":     "https://gw.example",
		" https://[::1]:8443 ":    "https://[::1]:8443",
		"HTTPS://10.0.0.1:8443":   "https://10.0.0.1:8443",
	} {
		if got, err := ParseGatewayURL(in); err != nil || got != want {
			t.Errorf("ParseGatewayURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"http://gw:8443", "gw:8443", "https://", "https://gw:0", "https://gw:8443/x", "https://gw?x=1", "https://gw#f", "https://u@gw", "nats://gw:4222", "https:gw"} {
		if got, err := ParseGatewayURL(in); err == nil {
			t.Errorf("ParseGatewayURL(%q) = %q, want an error", in, got)
		}
	}
}

// FuzzParseGatewayURL: what ParseGatewayURL accepts is an https URL of a
// host only, and accepting it again changes nothing.
func FuzzParseGatewayURL(f *testing.F) {
	for _, s := range []string{"https://gw:8443", "http://gw", "https://[::1]:1", "https://u@h", "https://h/p?q#f", "https:h", "https://h:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		got, err := ParseGatewayURL(raw)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "https://") || strings.ContainsAny(got[len("https://"):], "/?#@") {
			t.Fatalf("ParseGatewayURL(%q) = %q", raw, got)
		}
		again, err := ParseGatewayURL(got)
		if err != nil || again != got {
			t.Fatalf("ParseGatewayURL(%q) = %q, then %q, %v", raw, got, again, err)
		}
	})
}
