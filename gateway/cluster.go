package gateway

import (
	"errors"
	"fmt"
	"net"
	"os"
	"regexp"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file makes the embedded NATS server a node of a cluster: three
// gateways (or five), each with its embedded server, routed to each
// other, hold the registry, the audit trail, the join tokens and the
// skills in JetStream replicated on every node (R3), so that the fleet
// survives the loss of any one machine. The gateways of one cluster are
// one fleet: they share the operator-mode keys, the fleet CA and the
// signing key, which a second and third gateway take from the first one's
// data directory (SeedReplica, fleet-gateway replica-seed); their
// JetStream stores are their own.
//
// Routes speak TLS, with certificates from the fleet CA (each node issues
// its own at start, for server and client authentication, and accepts
// only peers the fleet CA signed) or the operator's.
//
// A node that starts while the fleet's agents reconnect cannot know yet
// which agents were revoked while it was down: that is in the agent
// records, in JetStream, which needs the other nodes. Until its gateway
// has read them and pushed the revocations, the node holds the fleet
// account without its agent signing key, so it refuses every agent
// credential (agents go to another node); the first push lifts that.

// ClusterConfig makes the embedded server a node of a NATS cluster.
type ClusterConfig struct {
	// Name is the cluster's name, the same on every node (letters,
	// digits, - and _). Empty: no cluster.
	Name string
	// Listen is where the node listens for the other nodes' routes
	// (host:port).
	Listen string
	// Routes are the route URLs of the cluster's nodes
	// (nats-route://host:port or host:port); this node's own may be among
	// them. At least two.
	Routes []string
	// RouteCert, RouteKey and RouteCA are the node's route certificate
	// chain and key and the CA its peers' certificates must chain to
	// (PEM files; all three or none). Default: a certificate from the
	// fleet CA, issued at every start for the names the node is reached
	// by (Config.Advertise, the listen address), and the fleet CA.
	RouteCert, RouteKey, RouteCA string
	// Wait bounds how long a starting node waits for the cluster's
	// JetStream: a quorum of the nodes, and at the very first start all
	// of them (the replicated streams need every replica's node). Default
	// 2 min.
	Wait time.Duration
}

func (c *ClusterConfig) setDefaults(cfg *Config) {
	if c.Name == "" {
		return
	}
	setDur(&c.Wait, 2*time.Minute)
	if cfg.Name == "" {
		if h, err := os.Hostname(); err == nil {
			cfg.Name = protocol.HostFromName(h)
		}
	}
}

// clustered reports whether the embedded server is a cluster node.
func (c *Config) clustered() bool { return c.Cluster.Name != "" }

// nameRE is what a gateway's or a cluster's name may be: it goes into
// session IDs, NATS server names and a load balancer's routing rules.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)

// validateCluster checks the cluster settings and the gateway's name.
func (c *Config) validateCluster() []error {
	var errs []error
	if c.Name != "" && !nameRE.MatchString(c.Name) {
		errs = append(errs, fmt.Errorf("gateway name %q (--name): use letters, digits, - and _ (at most 63, starting with a letter or digit)", protocol.Ellipsis(c.Name, 80)))
	}
	cl := &c.Cluster
	if cl.Name == "" {
		if cl.Listen != "" || len(cl.Routes) > 0 || cl.RouteCert != "" || cl.RouteKey != "" || cl.RouteCA != "" {
			errs = append(errs, errors.New("--nats_cluster_listen, --nats_routes and the route certificates are for a cluster of embedded servers: give --nats_cluster NAME too"))
		}
		return errs
	}
	if len(c.NATSURLs) > 0 {
		return append(errs, errors.New("--nats_cluster makes the embedded NATS server a node of a cluster; --nats_url uses an external cluster instead: give one or the other"))
	}
	if !nameRE.MatchString(cl.Name) {
		errs = append(errs, fmt.Errorf("cluster name %q (--nats_cluster): use letters, digits, - and _ (at most 63)", protocol.Ellipsis(cl.Name, 80)))
	}
	if c.Name == "" {
		errs = append(errs, errors.New("a cluster node needs a name of its own: give --name (the machine's hostname could not be read)"))
	}
	if c.NATSListen == "" {
		errs = append(errs, errors.New("a cluster node listens for agents: give --nats_listen"))
	}
	if _, _, err := net.SplitHostPort(cl.Listen); err != nil {
		errs = append(errs, fmt.Errorf("--nats_cluster_listen %q: want host:port, where the other nodes' routes reach this one (e.g. 0.0.0.0:6222)", cl.Listen))
	}
	if _, err := natsauth.RouteURLs(cl.Routes); err != nil {
		errs = append(errs, err)
	}
	given := 0
	for _, f := range []string{cl.RouteCert, cl.RouteKey, cl.RouteCA} {
		if f != "" {
			given++
		}
	}
	if given != 0 && given != 3 {
		errs = append(errs, errors.New("--nats_route_cert, --nats_route_key and --nats_route_ca go together: give all three (the node's route certificate, its key and the CA of its peers' certificates), or none to use the fleet CA"))
	}
	if cl.Wait < time.Second {
		errs = append(errs, fmt.Errorf("cluster wait %s is too short (minimum 1s)", cl.Wait))
	}
	return errs
}

// routeNames are the names a node's route certificate is issued for: the
// route listener's host (or, listening everywhere, the machine's names)
// and the advertised names.
func routeNames(cfg *Config) []string {
	host, _, _ := net.SplitHostPort(cfg.Cluster.Listen)
	return natsauth.LeafNames(host, cfg.Advertise)
}

// replicasDefault is the replica count of a stream or bucket whose
// setting is 0: 3 on a cluster (embedded, or an external one the
// gateway's server belongs to), else 1.
func replicasDefault(set int, clustered bool) int {
	switch {
	case set != 0:
		return set
	case clustered:
		return 3
	}
	return 1
}
