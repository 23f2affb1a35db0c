package identity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// pinnedTLS returns the TLS configuration that dials the gateway's fleet
// API before the agent has any reason to trust it but the CA pin the
// operator gave: the chain the server presents must hold a CA
// certificate whose protocol.CAPin is pin, and the leaf must verify
// against that certificate alone (as the only root, the rest of the chain
// as intermediates) for serverName, now. Neither the system's roots nor
// any certificate the server merely shows are trusted.
//
// InsecureSkipVerify only turns off the standard verification against
// the system's roots, which is replaced, not dropped: VerifyConnection
// runs on every handshake (also resumed ones) and fails it, so nothing is
// sent to a server that does not pass.
func pinnedTLS(pin, serverName string, now func() time.Time) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         serverName,
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPinned(cs.PeerCertificates, pin, serverName, now())
		},
	}
}

// errNoPinnedCA: the server's chain holds no certificate of the pin.
var errNoPinnedCA = errors.New("the gateway's certificate chain holds no CA certificate of the pin")

// verifyPinned checks chain (leaf first, as the server sent it) as
// pinnedTLS describes.
func verifyPinned(chain []*x509.Certificate, pin, serverName string, now time.Time) error {
	if len(chain) == 0 {
		return errors.New("the gateway presented no certificate")
	}
	leaf := chain[0]
	var root *x509.Certificate
	inter := x509.NewCertPool()
	for _, c := range chain {
		if root == nil && protocol.CAPin(c) == pin {
			root = c
			continue
		}
		if c != leaf {
			inter.AddCert(c)
		}
	}
	if root == nil {
		return fmt.Errorf("%w %s: this is not the gateway the pin is for (or the pin was mistyped): check --ca_pin against the output of fleetctl token create", errNoPinnedCA, pin)
	}
	roots := x509.NewCertPool()
	roots.AddCert(root)
	_, err := leaf.Verify(x509.VerifyOptions{
		DNSName:       serverName,
		Roots:         roots,
		Intermediates: inter,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("the gateway's certificate does not verify against the CA of pin %s for %q: %w", pin, serverName, err)
	}
	return nil
}

// VerifyPinned checks chain (leaf first, as the server sent it) the way
// every connection to the fleet API is checked: the leaf must verify for
// serverName at now against the chain's certificate of the CA pin, and
// that alone.
func VerifyPinned(chain []*x509.Certificate, pin, serverName string, now time.Time) error {
	return verifyPinned(chain, pin, serverName, now)
}
