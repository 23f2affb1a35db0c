package doctor

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Clock skew thresholds: a warning beyond skewWarn, a failure beyond
// protocol.MaxClockSkew, past which the gateway refuses enrolment and
// recovery requests.
const skewWarn = time.Minute

// checkFleetAPI dials the gateway's fleet API, checks its certificate
// against the CA pin as the agent does, and compares the local clock
// with the server's Date header.
func checkFleetAPI(ctx context.Context, gatewayURL, pin string, timeout time.Duration, now func() time.Time) []Result {
	r := Result{Check: "fleet API"}
	if gatewayURL == "" {
		return []Result{ok(r, "not checked: the agent enrolled in the gateway's process and has no fleet API to recover through")}
	}
	u, err := url.Parse(gatewayURL)
	if err != nil {
		return []Result{fail(r, err.Error(), reenrol)}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "443")
	}
	d := tls.Dialer{Config: &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname(),
		// Verified below against the pin alone, as the agent does.
		InsecureSkipVerify: true}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return []Result{fail(r, fmt.Sprintf("%s: %v", gatewayURL, err),
			"check that the gateway runs with --api_listen reachable from here (firewall, address); a proxy the agent would use is not tried")}
	}
	defer conn.Close()
	tc := conn.(*tls.Conn)
	chain := tc.ConnectionState().PeerCertificates
	t := now()
	if err := identity.VerifyPinned(chain, pin, u.Hostname(), t); err != nil {
		return []Result{fail(r, err.Error(), "if the gateway's CA changed, enrol again with the new pin (fleetctl token create prints it)")}
	}
	rs := []Result{leafValidity("fleet API cert", chain[0], t)}
	date, err := serverDate(ctx, tc, u.Host)
	if err != nil {
		return append([]Result{fail(r, fmt.Sprintf("%s: no answer: %v", gatewayURL, err), "check the gateway's log")}, rs...)
	}
	rs = append([]Result{ok(r, gatewayURL+": TLS verified against the pin")}, rs...)
	return append(rs, clockSkew(date, t))
}

// serverDate sends a request of nothing over conn (already verified) and
// returns the answer's Date header.
func serverDate(ctx context.Context, conn *tls.Conn, host string) (time.Time, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	req, _ := http.NewRequest(http.MethodGet, "https://"+host+"/", nil)
	req.Close = true
	if err := req.Write(conn); err != nil {
		return time.Time{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return time.Time{}, err
	}
	resp.Body.Close()
	d := resp.Header.Get("Date")
	if d == "" {
		return time.Time{}, errors.New("the answer has no Date header")
	}
	return http.ParseTime(d)
}

// clockSkew decides on the difference between the local clock (local)
// and the server's (server, to the second).
func clockSkew(server, local time.Time) Result {
	r := Result{Check: "clock skew"}
	skew := local.Sub(server)
	abs := skew.Abs()
	detail := fmt.Sprintf("this host's clock is %s %s the gateway's", abs.Round(time.Second), map[bool]string{true: "ahead of", false: "behind"}[skew >= 0])
	switch {
	case abs > protocol.MaxClockSkew:
		return fail(r, detail, fmt.Sprintf("sync the clock (NTP): beyond %s the gateway refuses this host's enrolment and recovery, and credentials look expired or not yet valid", protocol.MaxClockSkew))
	case abs > skewWarn:
		return warn(r, detail, "sync the clock (NTP)")
	}
	return ok(r, detail)
}

// leafValidity decides on the validity of a server's certificate: a
// failure outside it, a warning under 14 days left.
func leafValidity(check string, leaf *x509.Certificate, now time.Time) Result {
	r := Result{Check: check}
	left := leaf.NotAfter.Sub(now)
	detail := fmt.Sprintf("%q valid until %s (%s left)", leaf.Subject.CommonName, leaf.NotAfter.UTC().Format(time.RFC3339), daysLeft(max(left, 0)))
	switch {
	case now.Before(leaf.NotBefore):
		return fail(r, fmt.Sprintf("%q not valid before %s", leaf.Subject.CommonName, leaf.NotBefore.UTC().Format(time.RFC3339)), "check this host's clock")
	case left <= 0:
		return fail(r, detail, "renew the server's certificate")
	case left < 14*24*time.Hour:
		return warn(r, detail, "renew the server's certificate soon")
	}
	return ok(r, detail)
}

// natsInfo is what the check reads of a NATS server's INFO.
type natsInfo struct {
	TLSRequired  bool `json:"tls_required"`
	TLSAvailable bool `json:"tls_available"`
}

// checkNATS reaches a NATS server and, when it speaks TLS, verifies its
// certificate with the enrolment's CA (caPEM; empty: the system's
// roots). It authenticates nothing.
func checkNATS(ctx context.Context, rawURL, caPEM string, timeout time.Duration, now time.Time) Result {
	r := Result{Check: "nats " + rawURL}
	full := strings.TrimSpace(rawURL)
	if !strings.Contains(full, "://") {
		full = "nats://" + full
	}
	u, err := url.Parse(full)
	if err != nil || u.Hostname() == "" {
		return fail(r, fmt.Sprintf("not a NATS URL: %v", err), reenrol)
	}
	scheme := strings.ToLower(u.Scheme)
	port := u.Port()
	if port == "" {
		port = map[string]string{"ws": "80", "wss": "443"}[scheme]
		if port == "" {
			port = "4222"
		}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return fail(r, err.Error(), "check that the NATS server runs and that this host reaches it (firewall, address)")
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	switch scheme {
	case "ws":
		return ok(r, "reached (websocket, no TLS; the NATS handshake is not tried)")
	case "wss":
		return natsTLS(r, conn, u.Hostname(), caPEM, now)
	}
	info, err := readInfo(conn, timeout/2)
	wantTLS := scheme == "tls" || caPEM != ""
	switch {
	case err != nil && (!isTimeout(err) || !wantTLS):
		return fail(r, "no NATS INFO from the server: "+err.Error(), "check that the URL is a NATS server's client port (the gateway's --nats_listen)")
	case err == nil && !info.TLSRequired && !info.TLSAvailable:
		if wantTLS {
			return fail(r, "the server speaks no TLS, but the agent requires it", "check the URL: it is not the gateway's NATS port")
		}
		return ok(r, "reached; plain NATS (no TLS)")
	}
	// A server that sent no INFO may wait for the TLS handshake first.
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	return natsTLS(r, conn, u.Hostname(), caPEM, now)
}

// natsTLS handshakes over conn and verifies the server's certificate.
func natsTLS(r Result, conn net.Conn, host, caPEM string, now time.Time) Result {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: host, Time: func() time.Time { return now }}
	if caPEM != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(caPEM)) {
			return fail(r, "the enrolment's NATS CA is no PEM certificate", reenrol)
		}
		cfg.RootCAs = pool
	}
	tc := tls.Client(conn, cfg)
	if err := tc.Handshake(); err != nil {
		return fail(r, "TLS: "+err.Error(), "if the gateway's NATS CA changed, enrol again; check the URL names the server's certificate")
	}
	leaf := tc.ConnectionState().PeerCertificates[0]
	v := leafValidity(r.Check, leaf, now)
	if v.Status == OK {
		v.Detail = "reached; TLS verified with the enrolment's CA, " + v.Detail
	}
	return v
}

// readInfo reads the INFO line a NATS server sends first.
func readInfo(conn net.Conn, wait time.Duration) (*natsInfo, error) {
	_ = conn.SetReadDeadline(time.Now().Add(wait))
	line, err := bufio.NewReaderSize(conn, 4096).ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	rest, found := strings.CutPrefix(string(line), "INFO ")
	if !found {
		return nil, fmt.Errorf("the server sent %q, not INFO", protocol.Excerpt(string(line)))
	}
	var info natsInfo
	if err := json.Unmarshal([]byte(rest), &info); err != nil {
		return nil, fmt.Errorf("INFO: %w", err)
	}
	return &info, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
