package natsauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/fsutil"
)

// The fleet CA: the gateway generates it on first start in DataDir/tls
// (ca.pem, and ca.key mode 0600; ECDSA P-256, valid 10 years) and issues
// from it, at every start, the certificates of its listeners. Agents get
// the CA certificate at enrolment (after checking its pin) and trust
// nothing else for the fleet's NATS servers.

const (
	// TLSDir is the fleet CA's directory in the data directory,
	// CACertFile and CAKeyFile its certificate and key there.
	TLSDir     = "tls"
	CACertFile = "ca.pem"
	CAKeyFile  = "ca.key"
	// caValidity is how long the fleet CA is valid; leafValidity how long
	// a listener certificate is (they are issued again at every start).
	caValidity   = 10 * 365 * 24 * time.Hour
	leafValidity = 397 * 24 * time.Hour
)

// CA is the fleet's certificate authority.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte // the certificate, PEM-encoded
}

// LoadOrCreateCA reads the fleet CA in dataDir/tls, generating it the
// first time. The caller holds the data directory's lock.
func LoadOrCreateCA(dataDir string) (*CA, error) {
	dir := filepath.Join(dataDir, TLSDir)
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certPEM, cerr := os.ReadFile(certPath)
	keyPEM, kerr := os.ReadFile(keyPath)
	switch {
	case cerr == nil && kerr == nil:
		return parseCA(certPEM, keyPEM, certPath, keyPath)
	case errors.Is(cerr, os.ErrNotExist) && errors.Is(kerr, os.ErrNotExist):
	case cerr != nil && !errors.Is(cerr, os.ErrNotExist):
		return nil, fmt.Errorf("fleet CA: %w", cerr)
	case kerr != nil && !errors.Is(kerr, os.ErrNotExist):
		return nil, fmt.Errorf("fleet CA: %w", kerr)
	default:
		return nil, fmt.Errorf("fleet CA: only one of %s and %s exists; restore the other, or delete both to make a new CA (every agent must then enrol again)", certPath, keyPath)
	}
	ca, keyDER, err := newCA(time.Now())
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("fleet CA: %w", err)
	}
	// The key first: a certificate without its key is reported above,
	// a key without its certificate would be too.
	if err := fsutil.WriteFileAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, fmt.Errorf("fleet CA: %w", err)
	}
	if err := fsutil.WriteFileAtomic(certPath, ca.pem, 0o644); err != nil {
		os.Remove(keyPath)
		return nil, fmt.Errorf("fleet CA: %w", err)
	}
	return ca, nil
}

// newCA generates a CA certificate and key valid from now.
func newCA(now time.Time) (*CA, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet CA key: %w", err)
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"fleetmcp"}, CommonName: "fleetmcp fleet CA " + host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet CA certificate: %w", err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("fleet CA key: %w", err)
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, keyDER, nil
}

// parseCA reads a CA certificate and its key.
func parseCA(certPEM, keyPEM []byte, certPath, keyPath string) (*CA, error) {
	damaged := func(path string, err error) error {
		return fmt.Errorf("fleet CA: %s is damaged (%w): restore it from a backup, or delete %s and %s to make a new CA (every agent must then enrol again)",
			path, err, certPath, keyPath)
	}
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, damaged(certPath, errors.New("no PEM certificate"))
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, damaged(certPath, err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, damaged(keyPath, errors.New("no PEM key"))
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, damaged(keyPath, err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, damaged(keyPath, errors.New("the key is not the certificate's"))
	}
	if !cert.IsCA {
		return nil, damaged(certPath, errors.New("not a CA certificate"))
	}
	if time.Now().After(cert.NotAfter) {
		return nil, fmt.Errorf("fleet CA %s expired on %s: delete %s and %s to make a new one (every agent must then enrol again)",
			certPath, cert.NotAfter.Format(time.DateOnly), certPath, keyPath)
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})}, nil
}

// Pin returns the CA's pin (protocol.CAPin).
func (ca *CA) Pin() string { return protocol.CAPin(ca.cert) }

// CAKeyPath returns the path of the fleet CA's key in dataDir.
func CAKeyPath(dataDir string) string { return filepath.Join(dataDir, TLSDir, CAKeyFile) }

// PEM returns the CA's certificate, PEM-encoded: what agents get.
func (ca *CA) PEM() []byte { return ca.pem }

// Cert returns the CA's certificate.
func (ca *CA) Cert() *x509.Certificate { return ca.cert }

// loadCA reads the fleet CA of dataDir, refusing to make
// one.
func loadCA(dataDir string) (*CA, error) {
	dir := filepath.Join(dataDir, TLSDir)
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("%s has no fleet CA: %w", dataDir, err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("%s has no fleet CA key: %w", dataDir, err)
	}
	return parseCA(certPEM, keyPEM, certPath, keyPath)
}

// issueLeaf issues a server certificate for names (DNS names and IP
// addresses) from the CA, valid from now for leafValidity (never beyond
// the CA), with the chain a client needs.
func (ca *CA) issueLeaf(names []string, now time.Time) (tls.Certificate, error) {
	return ca.issueLeafFor(names, now, x509.ExtKeyUsageServerAuth)
}

// issueLeafFor is issueLeaf for the extended key usages usage.
func (ca *CA) issueLeafFor(names []string, now time.Time, usage ...x509.ExtKeyUsage) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("leaf key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{Organization: []string{"fleetmcp"}, CommonName: firstOr(names, "fleetmcp")},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     earliest(now.Add(leafValidity), ca.cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
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
		return tls.Certificate{}, fmt.Errorf("issue a certificate for %s: %w", strings.Join(names, ", "), err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

// ServerTLS returns a server TLS configuration with a leaf for names.
func (ca *CA) ServerTLS(names []string) (*tls.Config, error) {
	leaf, err := ca.issueLeaf(names, time.Now())
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{leaf}, MinVersion: tls.VersionTLS12}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func firstOr(s []string, def string) string {
	if len(s) > 0 {
		return s[0]
	}
	return def
}

// LeafNames returns the names a listener on listenHost is reached by: the
// host itself, or for an unspecified address (0.0.0.0, ::, "") the
// machine's hostname and every non-loopback interface address; always
// localhost and the loopback addresses; and the advertised names.
func LeafNames(listenHost string, advertise []string) []string {
	names := []string{"localhost", "127.0.0.1", "::1"}
	ip := net.ParseIP(listenHost)
	switch {
	case listenHost == "" || ip != nil && ip.IsUnspecified():
		if h, err := os.Hostname(); err == nil && h != "" {
			names = append(names, h)
		}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
					names = append(names, n.IP.String())
				}
			}
		}
	default:
		names = append(names, listenHost)
	}
	for _, a := range advertise {
		if a = strings.TrimSpace(a); a != "" {
			names = append(names, a)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}
