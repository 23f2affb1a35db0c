package natsauth

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A cluster node: the embedded server routed to the other gateways'
// servers, its routes speaking TLS with certificates from the fleet CA
// (each node issues its own at start, for server and client
// authentication, and accepts only peers the fleet CA signed) or the
// operator's. A node that starts cannot know yet which agents were
// revoked while it was down: until its gateway has read the records and
// pushed the revocations, it holds the fleet account without its agent
// and enrol signing keys, refusing every agent (embeddedAccount.closed).

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

// RouteURLs parses the route list (--nats_routes): at least two, each
// nats-route://host:port or host:port.
func RouteURLs(routes []string) ([]*url.URL, error) {
	if len(routes) < 2 {
		return nil, fmt.Errorf("--nats_routes names %d route(s): list the route URLs of the cluster's nodes (at least three nodes; this node's own route may be in the list), e.g. nats-route://gw1:6222,nats-route://gw2:6222,nats-route://gw3:6222", len(routes))
	}
	var out []*url.URL
	for _, r := range routes {
		raw := r
		if !strings.Contains(raw, "://") {
			raw = "nats-route://" + raw
		}
		u, err := url.Parse(raw)
		bad := func(why string) error {
			return fmt.Errorf("--nats_routes: %q %s; want nats-route://host:port", protocol.Ellipsis(r, 120), why)
		}
		switch {
		case err != nil:
			return nil, bad("does not parse")
		case u.Scheme != "nats-route" && u.Scheme != "nats":
			return nil, bad("has scheme " + u.Scheme)
		case u.User != nil:
			return nil, bad("carries a user: routes authenticate with TLS certificates")
		case u.Hostname() == "" || u.Port() == "":
			return nil, bad("needs a host and a port")
		case u.Path != "" && u.Path != "/", u.RawQuery != "":
			return nil, bad("has a path or query")
		}
		if p, err := strconv.Atoi(u.Port()); err != nil || p < 1 || p > 65535 {
			return nil, bad("has a bad port")
		}
		out = append(out, &url.URL{Scheme: "nats-route", Host: u.Host})
	}
	return out, nil
}

// ClusterOptions make the embedded server a node of a cluster.
type ClusterOptions struct {
	// Name is the cluster's name, ServerName this node's (the gateway's
	// name).
	Name, ServerName string
	// Listen is where the node listens for the other nodes' routes
	// (host:port, --nats_cluster_listen).
	Listen string
	// Routes are the route URLs of the cluster's nodes (RouteURLs).
	Routes []string
}

// clusterOptions makes opts a node of the cluster: its name, route
// listener, routes with TLS, and its client listener open from the start
// (routes only start with it).
func clusterOptions(cl *ClusterOptions, opts *server.Options, routeTLS *tls.Config) error {
	host, port, err := net.SplitHostPort(cl.Listen)
	if err != nil {
		return fmt.Errorf("--nats_cluster_listen %q: %w", cl.Listen, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("--nats_cluster_listen %q: bad port", cl.Listen)
	}
	if p == 0 {
		p = server.RANDOM_PORT
	}
	routes, err := RouteURLs(cl.Routes)
	if err != nil {
		return err
	}
	opts.ServerName = cl.ServerName
	opts.DontListen = false
	opts.Cluster = server.ClusterOpts{Name: cl.Name, Host: host, Port: p, TLSConfig: routeTLS, TLSTimeout: 5}
	opts.Routes = routes
	return nil
}
