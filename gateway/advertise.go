package gateway

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The addresses the gateway hands out (the fleet API's URL in the join
// commands it prints, the NATS URLs in every enrolment) must reach it from
// the hosts that get them. A machine's own hostname often does not: stock
// Debian maps it to 127.0.1.1 in /etc/hosts, and a host given
// tls://HOSTNAME:4222 then dials itself, for good. The gateway refuses to
// start when a name it advertises for a listener beyond loopback resolves
// to loopback only, and refuses an enrolment from another machine, before
// it spends the token, when the NATS URLs it would hand out do.

// lookupTimeout bounds one name lookup of an advertised address.
const lookupTimeout = 3 * time.Second

// ipLookup resolves a host name to its addresses (net.Resolver's
// LookupIPAddr).
type ipLookup func(ctx context.Context, host string) ([]net.IPAddr, error)

// advertiseHost returns the host agents are told to reach a listener on
// listen by: the first --advertise name; else the listener's host name,
// or the machine's hostname when it listens on every interface (or on an
// address, the address).
func advertiseHost(listen string, advertise []string) string {
	if len(advertise) > 0 && strings.TrimSpace(advertise[0]) != "" {
		return strings.TrimSpace(advertise[0])
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		if name, err := os.Hostname(); err == nil && name != "" {
			return name
		}
	}
	return host
}

// loopbackOnly reports whether host resolves to loopback addresses only,
// with the addresses it resolves to. A name that does not resolve here is
// not judged (false): it may resolve where the hosts are.
func loopbackOnly(ctx context.Context, lookup ipLookup, host string) (bool, []string) {
	if host == "" {
		return false, nil
	}
	if strings.EqualFold(host, "localhost") {
		return true, []string{"127.0.0.1"}
	}
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else {
		ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		defer cancel()
		addrs, err := lookup(ctx, host)
		if err != nil || len(addrs) == 0 {
			return false, nil
		}
		for _, a := range addrs {
			ips = append(ips, a.IP)
		}
	}
	var shown []string
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return false, nil
		}
		shown = append(shown, ip.String())
	}
	return true, shown
}

// urlHost returns the host name of a URL (a NATS URL may lack its
// scheme).
func urlHost(raw string) string {
	full := strings.TrimSpace(raw)
	if !strings.Contains(full, "://") {
		full = "nats://" + full
	}
	u, err := url.Parse(full)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// advertiseFix is the advice for an advertised name that resolves to
// loopback.
const advertiseFix = "give the gateway --advertise NAME, a DNS name or address the other machines reach this one by " +
	"(it names the fleet API and the NATS URLs both; --nats_advertise overrides the NATS URLs), or make the name resolve to this machine's network address (/etc/hosts, DNS)"

// checkAdvertised refuses names the gateway would advertise for a
// listener beyond loopback that resolve to loopback only: the fleet API's
// URL (for --api_listen) and the embedded server's NATS URLs (for
// --nats_listen, or those of --nats_advertise).
func (c *Config) checkAdvertised(ctx context.Context, lookup ipLookup) error {
	if c.APIListen != "" && !isLoopback(c.APIListen) {
		host := advertiseHost(c.APIListen, c.Advertise)
		if bad, ips := loopbackOnly(ctx, lookup, host); bad {
			return fmt.Errorf("the fleet API (--api_listen %s serves other machines) would be advertised to hosts as %s, but %s resolves to %s on this machine, a loopback address: "+
				"every host would dial itself; %s", c.APIListen, hostPort(host, c.APIListen), host, strings.Join(ips, ", "), advertiseFix)
		}
	}
	if len(c.NATSURLs) > 0 || c.NATSListen == "" || isLoopback(c.NATSListen) {
		return nil
	}
	for _, u := range c.agentNATSURLs("tls", portOf(c.NATSListen)) {
		host := urlHost(u)
		if bad, ips := loopbackOnly(ctx, lookup, host); bad {
			flag := "--advertise"
			if len(c.NATSAdvertise) > 0 {
				flag = "--nats_advertise"
			}
			return fmt.Errorf("agents would be given the NATS URL %s (%s; --nats_listen %s serves other machines), but %s resolves to %s on this machine, a loopback address: "+
				"every agent would dial itself and stay offline; %s", u, flag, c.NATSListen, host, strings.Join(ips, ", "), advertiseFix)
		}
	}
	return nil
}

// agentNATSURLs returns the NATS URLs agents are given for the embedded
// server listening on port with scheme: --nats_advertise, else the
// advertised host of --nats_listen.
func (c *Config) agentNATSURLs(scheme, port string) []string {
	if len(c.NATSAdvertise) > 0 {
		return c.NATSAdvertise
	}
	return []string{scheme + "://" + net.JoinHostPort(advertiseHost(c.NATSListen, c.Advertise), port)}
}

func portOf(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return port
}

func hostPort(host, listen string) string {
	return "https://" + net.JoinHostPort(host, portOf(listen))
}

// checkHandOut refuses, for a request from src (an address without port),
// to hand out NATS URLs that resolve to loopback only, unless src is a
// loopback address itself (an agent on the gateway's machine). It runs
// before a join token is spent.
func (g *Gateway) checkHandOut(ctx context.Context, src string) *protocol.APIError {
	ip := net.ParseIP(src)
	if ip == nil || ip.IsLoopback() {
		return nil
	}
	for _, u := range g.AgentNATSURLs() {
		host := urlHost(u)
		if bad, ips := loopbackOnly(ctx, g.lookupIP, host); bad {
			fix := advertiseFix
			switch {
			case len(g.cfg.NATSAdvertise) == 0 && len(g.cfg.NATSURLs) > 0:
				fix = "agents are given the gateway's own --nats_url: give --nats_advertise tls://NAME:PORT, the URL(s) other machines reach the NATS cluster by"
			case len(g.cfg.NATSAdvertise) > 0:
				fix = "give --nats_advertise tls://NAME:PORT with a name or address the other machines reach the NATS servers by"
			case g.conns.embedded != nil && isLoopback(g.cfg.NATSListen):
				fix = fmt.Sprintf("its NATS server listens on loopback only (--nats_listen %s): give --nats_listen 0.0.0.0:%s (or an address of the gateway's machine the hosts reach) "+
					"and --advertise NAME, a DNS name or address the other machines reach it by", g.cfg.NATSListen, portOf(g.cfg.NATSListen))
			}
			return apiErr(protocol.APIGatewayMisconfigured,
				"the gateway would give this host the NATS URL %s, but %s resolves to %s (loopback) on the gateway: this host would dial itself. "+
					"Nothing was spent. On the gateway, %s", u, host, strings.Join(ips, ", "), fix)
		}
	}
	return nil
}

// lookupIP resolves host with the configured resolver (tests) or the
// system's.
func (g *Gateway) lookupIP(ctx context.Context, host string) ([]net.IPAddr, error) {
	if g.cfg.lookupIP != nil {
		return g.cfg.lookupIP(ctx, host)
	}
	return net.DefaultResolver.LookupIPAddr(ctx, host)
}
