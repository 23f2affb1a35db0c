package gateway

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// writeLeaf issues a certificate for 127.0.0.1 from a new CA and writes
// its chain and key as PEM files; it returns their paths and the CA.
func writeLeaf(t *testing.T) (certFile, keyFile string, ca *natsauth.CA) {
	t.Helper()
	ca, err := natsauth.LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	conf, err := ca.ServerTLS([]string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	leaf := conf.Certificates[0]
	dir := t.TempDir()
	var chain []byte
	for _, der := range leaf.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, chain, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, ca
}

// --tls_cert/--tls_key make the MCP endpoint serve HTTPS; the fleet API
// serves a given certificate with --api_tls_cert/--api_tls_key and its
// pin is the chain's CA; both keys are among the secret paths.
func TestListenerCertificates(t *testing.T) {
	certFile, keyFile, ca := writeLeaf(t)
	gw := startAPIGateway(t, nil, func(c *Config) {
		c.TLSCert, c.TLSKey = certFile, keyFile
		c.APITLSCert, c.APITLSKey = certFile, keyFile
	})
	if !strings.HasPrefix(gw.MCPURL(), "https://127.0.0.1:") {
		t.Errorf("MCP URL %s", gw.MCPURL())
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert())
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	resp, err := hc.Get("https://" + gw.Addr() + "/healthz")
	if err != nil {
		t.Fatalf("MCP endpoint over TLS: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("healthz: %s", resp.Status)
	}
	if gw.APICAPin() != ca.Pin() {
		t.Errorf("fleet API pin %s, want the chain's CA %s", gw.APICAPin(), ca.Pin())
	}
	resp, err = hc.Get("https://" + gw.APIAddr() + "/v1/none")
	if err != nil {
		t.Fatalf("fleet API with the given certificate: %v", err)
	}
	resp.Body.Close()
	secrets := strings.Join(gw.SecretPaths(), "\n")
	if !strings.Contains(secrets, keyFile) {
		t.Errorf("secret paths %s do not name %s", secrets, keyFile)
	}
}

// A certificate that cannot be loaded stops the start with the flag's
// name.
func TestListenerCertificateErrors(t *testing.T) {
	certFile, keyFile, _ := writeLeaf(t)
	missing := filepath.Join(t.TempDir(), "none.pem")
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"MCP certificate missing", func(c *Config) { c.TLSCert, c.TLSKey = missing, keyFile }, "--tls_cert"},
		{"MCP key is the certificate", func(c *Config) { c.TLSCert, c.TLSKey = certFile, certFile }, "--tls_key"},
		{"fleet API certificate missing", func(c *Config) { c.APITLSCert, c.APITLSKey = missing, keyFile }, "--api_tls_cert"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), APIListen: "127.0.0.1:0", AuthDisabled: true, Logger: discardLogger()}
			tc.mod(&cfg)
			gw, err := Start(t.Context(), cfg)
			if err == nil {
				gw.Shutdown(t.Context())
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s", err, tc.want)
			}
		})
	}
}

// --nats_tls_cert/--nats_tls_key: the embedded server serves the given
// chain (on loopback too); agents get its CA (the chain's last
// certificate) and the pin printed and put in NATS join tokens is that
// CA's; a credential connects trusting that CA alone, an enrolment over
// NATS pinning it is taken, and the key is among the secret paths.
func TestEmbeddedNATSCertificate(t *testing.T) {
	certFile, keyFile, ca := writeLeaf(t)
	gw := startAPIGateway(t, nil, func(c *Config) { c.NATSTLSCert, c.NATSTLSKey = certFile, keyFile; c.APIListen = "" })
	if !strings.HasPrefix(gw.NATSURL(), "tls://127.0.0.1:") {
		t.Fatalf("NATS URL %s: want TLS on loopback with a given certificate", gw.NATSURL())
	}
	if gw.NATSCAPin() != ca.Pin() {
		t.Errorf("NATS CA pin %s, want the chain's CA %s", gw.NATSCAPin(), ca.Pin())
	}
	if string(gw.NATSCAPEM()) != string(ca.PEM()) {
		t.Errorf("agents get the CA %q, want the chain's last certificate", gw.NATSCAPEM())
	}
	kp := newUser(t)
	pub, _ := kp.PublicKey()
	creds, err := gw.EnrolLocal(t.Context(), "web-1", pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	if creds.CAPin != ca.Pin() || string(creds.CAPEM) != string(ca.PEM()) {
		t.Errorf("credentials carry pin %s", creds.CAPin)
	}
	seed, _ := kp.Seed()
	nc := connectAgent(t, gw, "web-1", creds.JWT, seed, ca.PEM())
	if !nc.IsConnected() {
		t.Fatal("not connected with the given chain's CA")
	}
	resp, nt := natsToken(t, gw, protocol.TokenCreateRequest{Name: "web-2"})
	if resp.CAPin != ca.Pin() || !strings.Contains(resp.JoinCommand, "--ca_pin "+ca.Pin()) {
		t.Errorf("NATS join token pin %s, command %q", resp.CAPin, resp.JoinCommand)
	}
	c := mustDialEnrol(t, gw, nt)
	if got, code := natsEnrol(t, c.nc, resp.Info.ID, enrolReq(t, newUser(t), nt.Token, "", ca.Pin(), time.Now())); code != "" || got.Host != "web-2" {
		t.Errorf("enrolment over NATS pinning the given chain's CA: %q %+v", code, got)
	}
	if !slices.Contains(gw.SecretPaths(), keyFile) {
		t.Errorf("secret paths %v do not name %s", gw.SecretPaths(), keyFile)
	}
}

// A NATS certificate that cannot be loaded, or a chain without its CA,
// stops the start and says what to give.
func TestEmbeddedNATSCertificateErrors(t *testing.T) {
	certFile, keyFile, _ := writeLeaf(t)
	// The leaf alone, without the CA after it.
	data, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	leafOnly := filepath.Join(t.TempDir(), "leaf.pem")
	if err := os.WriteFile(leafOnly, pem.EncodeToMemory(b), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "none.pem")
	for _, tc := range []struct {
		name        string
		cert, key   string
		want, want2 string
	}{
		{"missing", missing, keyFile, "--nats_tls_cert", missing},
		{"key is the certificate", certFile, certFile, "--nats_tls_key", certFile},
		{"no CA after the leaf", leafOnly, keyFile, "not a CA certificate", "append the certificate of the CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), NATSListen: "127.0.0.1:0", NATSTLSCert: tc.cert, NATSTLSKey: tc.key,
				AuthDisabled: true, Logger: discardLogger()}
			gw, err := Start(t.Context(), cfg)
			if err == nil {
				gw.Shutdown(t.Context())
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.want2) {
				t.Errorf("error %q does not say %q and %q", err, tc.want, tc.want2)
			}
		})
	}
}
