package identity

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Failures to reach the gateway are explained as its refusals are: what
// was dialled, what the name resolved to, and what to check, rather than
// a bare "dial tcp ...: connect: connection refused".

// resolveTimeout bounds the lookup that says what a name resolved to.
const resolveTimeout = 2 * time.Second

// resolved says what host resolves to on this machine, for a message:
// "10.0.0.5", "127.0.1.1, a loopback address of this machine"; "" when
// it does not resolve.
func resolved(ctx context.Context, host string) string {
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() {
			return ip.String() + ", a loopback address of this machine"
		}
		return ip.String()
	}
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil || len(addrs) == 0 {
		return ""
	}
	var out []string
	loop := true
	for _, a := range addrs {
		out = append(out, a.IP.String())
		loop = loop && a.IP.IsLoopback()
	}
	s := strings.Join(out, ", ")
	if loop {
		s += ", loopback: this machine itself"
	}
	return s
}

// netCause names the network failure of err in a few words, or "" when
// err is not one.
func netCause(err error) string {
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.As(err, &dnsErr):
		return "the name does not resolve (" + dnsErr.Err + ")"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused: nothing listens there"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to it"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, syscall.ECONNRESET):
		return "no answer in time (a firewall dropping packets, or the wrong address)"
	case errors.As(err, &opErr) && opErr.Op == "dial":
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return "no answer in time (a firewall dropping packets, or the wrong address)"
		}
		return opErr.Err.Error()
	}
	return ""
}

// UnreachableError is a fleet API or NATS server that could not be
// reached at all.
type UnreachableError struct {
	What     string // "the fleet API", "NATS"
	URL      string
	Resolved string // what its host resolves to ("": nothing)
	Cause    string // netCause
	Advice   string
	Err      error
}

func (e *UnreachableError) Error() string {
	if e.Resolved == "" {
		return fmt.Sprintf("%s is not reachable at %s: %s; %s", e.What, e.URL, e.Cause, e.Advice)
	}
	return fmt.Sprintf("%s is not reachable at %s (resolved to %s): %s; %s", e.What, e.URL, e.Resolved, e.Cause, e.Advice)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// apiUnreachable explains a failure to reach the fleet API at base, or
// returns nil when err is not a network failure.
func apiUnreachable(ctx context.Context, base string, err error) error {
	cause := netCause(err)
	if cause == "" {
		return nil
	}
	u, perr := url.Parse(base)
	if perr != nil {
		return nil
	}
	return &UnreachableError{What: "the fleet API", URL: base, Resolved: resolved(context.WithoutCancel(ctx), u.Hostname()), Cause: cause, Err: err,
		Advice: "check the gateway's --api_listen and --advertise (the URL hosts are given), and the firewalls between this host and the gateway"}
}

// ProbeTimeout bounds one probe of a NATS URL.
const ProbeTimeout = 5 * time.Second

// ProbeNATS checks that this host can use one of the NATS URLs it was
// given: a TCP connection, the server's INFO, and for tls:// (or with a
// CA) a TLS handshake that verifies the server's certificate against ca
// (PEM; empty: the system's roots). It returns nil when one URL works,
// else an error that names each URL, what its host resolves to, and why
// it failed.
func ProbeNATS(ctx context.Context, urls []string, ca string) error {
	if len(urls) == 0 {
		return errors.New("the enrolment holds no NATS URL")
	}
	var errs []error
	for _, raw := range urls {
		err := probeNATS(ctx, raw, ca)
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func probeNATS(ctx context.Context, raw, ca string) error {
	full := strings.TrimSpace(raw)
	if !strings.Contains(full, "://") {
		full = "nats://" + full
	}
	u, err := url.Parse(full)
	if err != nil || u.Hostname() == "" {
		return fmt.Errorf("NATS URL %q: not a URL", raw)
	}
	port := u.Port()
	if port == "" {
		port = "4222"
	}
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	fail := func(cause string, err error) error {
		return &UnreachableError{What: "NATS", URL: u.Redacted(), Resolved: resolved(context.WithoutCancel(ctx), u.Hostname()), Cause: cause, Err: err,
			Advice: "the gateway hands out this URL: check its --advertise (or --nats_advertise) and --nats_listen, and the firewalls between this host and it"}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return fail(causeOr(err), err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	line, err := bufio.NewReaderSize(conn, 64<<10).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "INFO ") {
		if err == nil {
			err = fmt.Errorf("it answered %q", protocol.Ellipsis(line, 80))
		}
		return fail("not a NATS server (no INFO line)", err)
	}
	if !strings.EqualFold(u.Scheme, "tls") && ca == "" {
		return nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()}
	if ca != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(ca)) {
			return errors.New("the NATS CA of the enrolment is not PEM")
		}
		conf.RootCAs = pool
	}
	tc := tls.Client(conn, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		var verr *tls.CertificateVerificationError
		var herr x509.HostnameError
		switch {
		case errors.As(err, &herr):
			return fail(fmt.Sprintf("the server's certificate is not valid for %q (%v)", u.Hostname(), herr), err)
		case errors.As(err, &verr):
			return fail(fmt.Sprintf("the server's certificate does not verify against the fleet's NATS CA (%v): another server answers there", verr.Err), err)
		}
		return fail("TLS handshake failed ("+err.Error()+")", err)
	}
	return nil
}

func causeOr(err error) string {
	if c := netCause(err); c != "" {
		return c
	}
	return err.Error()
}
