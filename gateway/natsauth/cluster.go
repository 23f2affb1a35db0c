package natsauth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"time"
)

// RouteTLS returns the TLS configuration of a cluster node's routes: the
// operator's files (certFile and keyFile, the node's chain and key, and
// caFile, the CA of its peers' certificates: --nats_route_cert,
// --nats_route_key, --nats_route_ca), or without them a certificate from
// the fleet CA ca for names.
func RouteTLS(certFile, keyFile, caFile string, ca *CA, names []string) (*tls.Config, error) {
	var cert tls.Certificate
	pool := x509.NewCertPool()
	if certFile != "" {
		var err error
		if cert, err = tls.LoadX509KeyPair(certFile, keyFile); err != nil {
			return nil, fmt.Errorf("route TLS (--nats_route_cert %s, --nats_route_key %s): %w", certFile, keyFile, err)
		}
		data, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("route TLS (--nats_route_ca): %w", err)
		}
		if !pool.AppendCertsFromPEM(data) {
			return nil, fmt.Errorf("route TLS: --nats_route_ca %s holds no PEM certificate", caFile)
		}
	} else {
		var err error
		if cert, err = ca.issueLeafFor(names, time.Now(), x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth); err != nil {
			return nil, fmt.Errorf("route TLS: %w", err)
		}
		pool.AddCert(ca.cert)
	}
	// The same configuration accepts routes (the peer must show a
	// certificate the CA signed) and dials them (the peer's certificate
	// must verify for the route URL's host).
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}, nil
}
