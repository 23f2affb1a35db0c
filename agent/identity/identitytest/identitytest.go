// Package identitytest gives tests of enrolment what they need from the
// other side: certificate authorities and server certificates made on
// the spot, and a fleet API (POST /v1/enrol and /v1/recover over TLS)
// that checks every request the way the contract in protocol/enrol.go
// says the gateway must. It imports nothing of the module but protocol.
package identitytest

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// CA is a certificate authority made for a test.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

var serial atomic.Int64

// NewCA makes a self-signed CA.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	return newCA(t, name, nil)
}

// NewIntermediate makes a CA signed by parent.
func NewIntermediate(t testing.TB, parent *CA, name string) *CA {
	t.Helper()
	return newCA(t, name, parent)
}

func newCA(t testing.TB, name string, parent *CA) *CA {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{Cert: cert, Key: key}
}

// Pin returns the CA's pin.
func (ca *CA) Pin() string { return protocol.CAPin(ca.Cert) }

// PEM returns the CA's certificate in PEM.
func (ca *CA) PEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}))
}

// Leaf issues a server certificate for names (DNS names or IP
// addresses), valid from notBefore to notAfter; the server presents
// chain after it.
func (ca *CA) Leaf(t testing.TB, names []string, notBefore, notAfter time.Time, chain ...*x509.Certificate) tls.Certificate {
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		t.Fatal(err)
	}
	c := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	for _, x := range chain {
		c.Certificate = append(c.Certificate, x.Raw)
	}
	return c
}

// Gateway is the fleet API as the contract describes it. It enrols a
// host under the name asked for ("from-token" when none is), refuses a
// name held by another key (name_taken), and recovers a host only as
// often as AllowRecovery says.
type Gateway struct {
	t   testing.TB
	srv *httptest.Server
	// URL is the API's https:// URL, Pin the pin it answers to, Token
	// the one join token it knows, NATSCA the NATS CA its answers carry.
	URL, Pin, Token, NATSCA string
	// NATSURLs are the URLs its answers carry; SigningKeys the gateway
	// signing keys.
	NATSURLs    []string
	SigningKeys []string
	account     nkeys.KeyPair

	mu       sync.Mutex
	requests int // enrolments and recoveries
	locates  int
	nonces   map[string]bool
	keys     map[string]string // host -> public key enrolled
	revoked  map[string]bool   // public keys revoked
	tokens   []string          // tokens made by NewToken
	refuse   protocol.APICode
	// refuseNext, refuseLeft: the next refuseLeft enrolments are refused
	// with refuseNext.
	refuseNext protocol.APICode
	refuseLeft int
	recovery   int
	last       protocol.EnrolRequest
	issued     int
	// hold, when set, holds every enrolment until it is closed; held
	// hears of each one held.
	hold chan struct{}
	held chan struct{}
}

// NewGateway serves the fleet API with a certificate of ca for 127.0.0.1
// and localhost, presenting ca after it.
func NewGateway(t testing.TB, ca *CA) *Gateway {
	t.Helper()
	cert := ca.Leaf(t, []string{"127.0.0.1", "localhost"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour), ca.Cert)
	return NewGatewayCert(t, ca.Pin(), cert)
}

// NewGatewayCert serves the fleet API with cert, answering to pin.
func NewGatewayCert(t testing.TB, pin string, cert tls.Certificate) *Gateway {
	t.Helper()
	_, _, token := protocol.NewJoinToken()
	acc, _ := nkeys.CreateAccount()
	signing, _, _ := ed25519.GenerateKey(nil)
	g := &Gateway{t: t, Pin: pin, Token: token, account: acc, nonces: map[string]bool{}, keys: map[string]string{}, revoked: map[string]bool{},
		NATSCA: NewCA(t, "nats").PEM(), NATSURLs: []string{"tls://127.0.0.1:1"}, SigningKeys: []string{protocol.FormatSigningKey(signing)}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+protocol.EnrolPath, g.enrol)
	mux.HandleFunc("POST "+protocol.RecoverPath, g.recover)
	mux.HandleFunc("POST "+protocol.LocatePath, g.locate)
	g.srv = httptest.NewUnstartedServer(mux)
	g.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	g.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshakes clients refuse
	g.srv.StartTLS()
	t.Cleanup(g.srv.Close)
	g.URL = g.srv.URL
	return g
}

// Close stops serving the API: requests then fail to connect.
func (g *Gateway) Close() { g.srv.Close() }

// Locates returns how many requests for the NATS URLs reached the API.
func (g *Gateway) Locates() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.locates
}

// Requests returns how many enrolment and recovery requests reached the
// API.
func (g *Gateway) Requests() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.requests
}

// Refuse makes the API refuse every enrolment with code ("": stop).
func (g *Gateway) Refuse(code protocol.APICode) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refuse = code
}

// RefuseNext makes the API refuse the next n enrolments with code, and
// then answer as before.
func (g *Gateway) RefuseNext(code protocol.APICode, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refuseNext, g.refuseLeft = code, n
}

// NewToken returns another join token the API accepts, as a second
// fleetctl token create makes.
func (g *Gateway) NewToken() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, _, token := protocol.NewJoinToken()
	g.tokens = append(g.tokens, token)
	return token
}

// Revoke revokes host, as fleetctl agent revoke does: its key gets
// nothing again, and a token enrols the name with another key (as one
// made with --replace does).
func (g *Gateway) Revoke(host string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.revoked[g.keys[host]] = true
	delete(g.keys, host)
}

// AllowRecovery allows n recoveries.
func (g *Gateway) AllowRecovery(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.recovery = n
}

// Hold makes the API hold every enrolment request that reaches it until
// release is called: arrived receives one value per request held.
func (g *Gateway) Hold() (arrived <-chan struct{}, release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	hold, held := make(chan struct{}), make(chan struct{}, 16)
	g.hold, g.held = hold, held
	var once sync.Once
	return held, func() { once.Do(func() { close(hold) }) }
}

// LastEnrolment returns the last enrolment request that reached the API.
func (g *Gateway) LastEnrolment() protocol.EnrolRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.last
}

func writeAPIError(w http.ResponseWriter, status int, code protocol.APICode, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(&protocol.APIError{Code: code, Message: msg})
}

// checkProof checks a proof of possession as the gateway must: the
// signature over signing by the key, a fresh nonce, the time.
func (g *Gateway) checkProof(p *protocol.Proof, signing []byte) (protocol.APICode, string) {
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

func (g *Gateway) answer(w http.ResponseWriter, host, pub string) {
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
		NATSURLs: g.NATSURLs, NATSCA: g.NATSCA, Labels: map[string]string{"env": "prod"}, SigningKeys: g.SigningKeys})
}

func (g *Gateway) enrol(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	hold, held := g.hold, g.held
	g.mu.Unlock()
	if hold != nil {
		held <- struct{}{}
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.requests++
	var req protocol.EnrolRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, protocol.MaxAPIRequestBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeAPIError(w, http.StatusBadRequest, protocol.APIBadRequest, err.Error())
		return
	}
	g.last = req
	if code, msg := g.checkProof(&req.Proof, req.SigningBytes()); code != "" {
		writeAPIError(w, http.StatusBadRequest, code, msg)
		return
	}
	switch {
	case req.CAPin != g.Pin:
		writeAPIError(w, http.StatusBadRequest, protocol.APIWrongCA, "not this gateway's CA")
		return
	case g.refuse != "":
		writeAPIError(w, http.StatusForbidden, g.refuse, "refused as the test asked")
		return
	case g.refuseLeft > 0:
		g.refuseLeft--
		writeAPIError(w, http.StatusServiceUnavailable, g.refuseNext, "refused this once as the test asked")
		return
	case req.Token != g.Token && !slices.Contains(g.tokens, req.Token):
		writeAPIError(w, http.StatusForbidden, protocol.APITokenUnknown, "no such token")
		return
	}
	host := req.Host
	if host == "" {
		host = "from-token"
	}
	if g.revoked[req.PublicKey] {
		writeAPIError(w, http.StatusForbidden, protocol.APIKeyRevoked, "key "+req.PublicKey+" was revoked")
		return
	}
	if k, ok := g.keys[host]; ok && k != req.PublicKey {
		writeAPIError(w, http.StatusConflict, protocol.APINameTaken, "host "+host+" is enrolled with another key")
		return
	}
	g.keys[host] = req.PublicKey
	g.answer(w, host, req.PublicKey)
}

// SetNATSURLs changes the NATS URLs the API's answers carry.
func (g *Gateway) SetNATSURLs(urls []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.NATSURLs = urls
}

// locate answers an enrolled key with the current NATS URLs.
func (g *Gateway) locate(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.locates++
	var req protocol.LocateRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, protocol.MaxAPIRequestBytes)).Decode(&req); err != nil {
		writeAPIError(w, http.StatusBadRequest, protocol.APIBadRequest, err.Error())
		return
	}
	if code, msg := g.checkProof(&req.Proof, req.SigningBytes()); code != "" {
		writeAPIError(w, http.StatusBadRequest, code, msg)
		return
	}
	switch {
	case req.CAPin != g.Pin:
		writeAPIError(w, http.StatusBadRequest, protocol.APIWrongCA, "not this gateway's CA")
	case g.keys[req.Host] != req.PublicKey:
		writeAPIError(w, http.StatusNotFound, protocol.APIUnknownHost, "no such host with this key")
	default:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(protocol.LocateResponse{Host: req.Host, NATSURLs: g.NATSURLs, NATSCA: g.NATSCA})
	}
}

func (g *Gateway) recover(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.requests++
	var req protocol.RecoverRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, protocol.MaxAPIRequestBytes)).Decode(&req); err != nil {
		writeAPIError(w, http.StatusBadRequest, protocol.APIBadRequest, err.Error())
		return
	}
	if code, msg := g.checkProof(&req.Proof, req.SigningBytes()); code != "" {
		writeAPIError(w, http.StatusBadRequest, code, msg)
		return
	}
	switch {
	case req.CAPin != g.Pin:
		writeAPIError(w, http.StatusBadRequest, protocol.APIWrongCA, "not this gateway's CA")
	case g.revoked[req.PublicKey]:
		writeAPIError(w, http.StatusForbidden, protocol.APIHostRevoked, "host "+req.Host+" was revoked")
	case g.keys[req.Host] != req.PublicKey:
		writeAPIError(w, http.StatusNotFound, protocol.APIUnknownHost, "no such host with this key")
	case g.recovery == 0:
		writeAPIError(w, http.StatusForbidden, protocol.APINoRecovery, "no recovery allowed for "+req.Host)
	default:
		g.recovery--
		g.answer(w, req.Host, req.PublicKey)
	}
}

// ServeNATSGreeting serves the start of a NATS connection on loopback, as
// far as a probe of the URL looks (the INFO line, then a TLS handshake
// with a certificate of a new NATS CA), and makes it the NATS URL and CA
// the API's answers carry. It returns the URL.
func (g *Gateway) ServeNATSGreeting(t testing.TB) string {
	t.Helper()
	ca := NewCA(t, "nats")
	cert := ca.Leaf(t, []string{"127.0.0.1", "localhost"}, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.Write([]byte("INFO {\"tls_required\":true}\r\n")); err != nil {
					return
				}
				_ = tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}}).Handshake()
			})
		}
	})
	url := "tls://" + ln.Addr().String()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.NATSURLs, g.NATSCA = []string{url}, ca.PEM()
	return url
}
