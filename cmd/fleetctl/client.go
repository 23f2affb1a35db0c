package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// maxAnswerBytes bounds an answer of the admin API.
const maxAnswerBytes = 16 << 20

// client speaks the gateway's admin API.
type client struct {
	base  *url.URL // https://HOST[:PORT][/prefix]
	token string   // admin bearer token; empty: none (a gateway without authentication)
	trust string   // how the gateway's certificate is checked, for error messages
	http  *http.Client
}

// connection is what the global flags say about reaching the gateway,
// checked once.
type connection struct {
	gateway   string
	token     string
	tokenFile string
	caPin     string
	caFile    string
	timeout   time.Duration
}

// newClient checks the connection settings and returns a client.
func newClient(c connection) (*client, error) {
	base, err := parseGatewayURL(c.gateway)
	if err != nil {
		return nil, err
	}
	token, err := c.adminToken()
	if err != nil {
		return nil, err
	}
	if c.timeout <= 0 {
		return nil, fmt.Errorf("--timeout %s: give a positive duration, e.g. 30s", c.timeout)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	trust := "the system's trusted CAs"
	switch {
	case c.caPin != "" && c.caFile != "":
		return nil, errors.New("--ca_pin and --ca_file both given: the gateway's CA is either pinned or read from a file; give one")
	case c.caPin != "":
		if !protocol.ValidCAPin(c.caPin) {
			return nil, fmt.Errorf("--ca_pin %q is not a CA pin: it is %s and 64 lowercase hex digits, as the gateway prints it", c.caPin, protocol.CAPinPrefix)
		}
		tc.InsecureSkipVerify = true // VerifyConnection does the whole check, against the pinned CA only
		tc.VerifyConnection = verifyPinned(base.Hostname(), c.caPin)
		trust = "the CA with pin " + c.caPin
	case c.caFile != "":
		pemData, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pemData) {
			return nil, fmt.Errorf("--ca_file %s holds no PEM certificate: give the gateway's CA (DATA_DIR/tls/ca.pem)", c.caFile)
		}
		tc.RootCAs = pool
		trust = "the CA of " + c.caFile
	}
	transport := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     tc,
		TLSHandshakeTimeout: c.timeout,
		ForceAttemptHTTP2:   true,
	}
	hc := &http.Client{
		Transport: transport,
		Timeout:   c.timeout,
		// A redirect is not followed: the admin token goes to the
		// gateway named and nowhere else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &client{base: base, token: token, trust: trust, http: hc}, nil
}

// parseGatewayURL checks --gateway: an https URL of the fleet API.
func parseGatewayURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("no gateway: give --gateway https://GATEWAY:8443 (or set FLEET_GATEWAY), the address of the gateway's fleet API (--api_listen)")
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("--gateway %q: %w", s, err)
	}
	switch {
	case u.Scheme == "http":
		return nil, fmt.Errorf("--gateway %s: the fleet API is HTTPS only (requests carry an admin token, answers carry join tokens); use https://%s", s, u.Host)
	case u.Scheme != "https" || u.Host == "":
		return nil, fmt.Errorf("--gateway %q: want https://HOST[:PORT], the address of the gateway's fleet API (--api_listen)", s)
	case u.User != nil || u.RawQuery != "" || u.Fragment != "":
		return nil, fmt.Errorf("--gateway %q: give only https://HOST[:PORT][/PATH], without user, query or fragment", s)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	return u, nil
}

// adminToken returns the admin token from --api_token or --api_token_file.
func (c connection) adminToken() (string, error) {
	if c.tokenFile == "" {
		return strings.TrimSpace(c.token), nil
	}
	if c.token != "" {
		return "", errors.New("--api_token (or FLEET_API_TOKEN) and --api_token_file both given: give one")
	}
	data, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return "", fmt.Errorf("--api_token_file: %w", err)
	}
	token := strings.TrimSpace(string(data))
	if token == "" || strings.ContainsAny(token, "\r\n") {
		return "", fmt.Errorf("--api_token_file %s: want one token on one line", c.tokenFile)
	}
	return token, nil
}

// verifyPinned returns a TLS check that trusts only the certificate of
// the presented chain whose CA pin is pin, and verifies the leaf against
// it and host: the rule fleet-agent join uses.
func verifyPinned(host, pin string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		chain := cs.PeerCertificates
		if len(chain) == 0 {
			return errors.New("the gateway presented no certificate")
		}
		var anchor *x509.Certificate
		for _, c := range chain {
			if protocol.CAPin(c) == pin {
				anchor = c
				break
			}
		}
		if anchor == nil {
			return &pinMismatchError{want: pin, chain: chain}
		}
		roots, inter := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(anchor)
		for _, c := range chain[1:] {
			if c != anchor {
				inter.AddCert(c)
			}
		}
		_, err := chain[0].Verify(x509.VerifyOptions{
			DNSName: host, Roots: roots, Intermediates: inter,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return fmt.Errorf("the gateway's certificate does not check out against the pinned CA: %w", err)
		}
		return nil
	}
}

// pinMismatchError says that no certificate the gateway presented has
// the pin asked for.
type pinMismatchError struct {
	want  string
	chain []*x509.Certificate
}

func (e *pinMismatchError) Error() string {
	var got []string
	for _, c := range e.chain {
		got = append(got, fmt.Sprintf("%s (%q)", protocol.CAPin(c), c.Subject.CommonName))
	}
	return fmt.Sprintf("the gateway's certificates have the pins %s, none of them %s (--ca_pin or FLEET_CA_PIN): "+
		"this is another gateway, or something between you and the gateway presents its own certificate; "+
		"check the address, and the pin: the gateway prints it at start (\"CA pin:\"), and it is the pin of DATA_DIR/tls/ca.pem",
		strings.Join(got, ", "), e.want)
}

// call sends a request with body as JSON (nil: none) to path (which may
// end in a ?query) and returns the
// answer's body; a 2xx answer is decoded into out (when not nil and not
// empty).
func (c *client) call(ctx context.Context, method, path string, body, out any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	p, query, _ := strings.Cut(path, "?")
	u := c.base.JoinPath(p)
	u.RawQuery = query
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, c.explain(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read the gateway's answer to %s %s: %w", method, u.Path, err)
	}
	if len(data) > maxAnswerBytes {
		return nil, fmt.Errorf("the gateway's answer to %s %s is larger than %d MiB", method, u.Path, maxAnswerBytes>>20)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, c.refusal(method, u, resp, data)
	}
	if out != nil && len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, out); err != nil {
			return nil, fmt.Errorf("the gateway's answer to %s %s is not what fleetctl expects (%w): is fleetctl as new as the gateway?", method, u.Path, err)
		}
	}
	return data, nil
}

// apiError is an API error the gateway answered with.
type apiError struct {
	status int
	api    protocol.APIError
}

func (e *apiError) Error() string {
	msg := e.api.Error()
	switch {
	case e.status == http.StatusUnauthorized || e.api.Code == protocol.APIUnauthorized:
		msg += "\nthe admin API needs an admin token: give --api_token_file FILE (or FLEET_API_TOKEN) with an API token whose entry in the gateway's --api_tokens file says admin: true " +
			"(make one with fleet-gateway --new_api_token NAME), or an OIDC access token whose access rule says admin: true"
	case e.status == http.StatusForbidden || e.api.Code == protocol.APIForbidden:
		msg += "\nthis token is not an admin's: the gateway's operator can mark its entry in --api_tokens, or the access rule that matches you, admin: true"
	}
	return msg
}

// refusal turns an answer other than 2xx into an error.
func (c *client) refusal(method string, u *url.URL, resp *http.Response, data []byte) error {
	var ae protocol.APIError
	if json.Unmarshal(data, &ae) == nil && ae.Code != "" {
		return &apiError{status: resp.StatusCode, api: ae}
	}
	what := fmt.Sprintf("the gateway answered %s %s with %s", method, u.Path, resp.Status)
	if excerpt := strings.TrimSpace(string(data)); excerpt != "" {
		what += ": " + protocol.Clip(excerpt, 200)
	}
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return fmt.Errorf("%s to %s, which fleetctl does not follow (the admin token goes only to --gateway): give that address as --gateway if you trust it", what, resp.Header.Get("Location"))
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("%s: %s has no admin API; --gateway must be the gateway's fleet API (--api_listen, default port 8443), not its MCP endpoint", what, c.base)
	case resp.StatusCode == http.StatusUnauthorized:
		return &apiError{status: resp.StatusCode, api: protocol.APIError{Code: protocol.APIUnauthorized, Message: what}}
	case resp.StatusCode == http.StatusForbidden:
		return &apiError{status: resp.StatusCode, api: protocol.APIError{Code: protocol.APIForbidden, Message: what}}
	}
	return errors.New(what)
}

// explain says what to check when the gateway could not be asked.
func (c *client) explain(err error) error {
	host := c.base.Host
	var pinErr *pinMismatchError
	var hostErr x509.HostnameError
	var authErr x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	var dnsErr *net.DNSError
	var opErr *net.OpError
	switch {
	case errors.As(err, &pinErr):
		return fmt.Errorf("refused the gateway at %s: %w", host, pinErr)
	case errors.As(err, &hostErr):
		return fmt.Errorf("refused the gateway at %s: its certificate is not valid for %q (%w); use a name or address it was issued for, or give the gateway --advertise %s",
			host, c.base.Hostname(), hostErr, c.base.Hostname())
	case errors.As(err, &authErr):
		return fmt.Errorf("refused the gateway at %s: its certificate is not signed by %s (%w); give --ca_pin with the gateway's CA pin (or FLEET_CA_PIN), or --ca_file with its CA",
			host, c.trust, authErr)
	case errors.As(err, &invalid):
		return fmt.Errorf("refused the gateway at %s: %w; check the clocks of both machines, and that the gateway's certificate is current", host, invalid)
	case errors.As(err, &record) || strings.Contains(err.Error(), "server gave HTTP response to HTTPS client"):
		return fmt.Errorf("the server at %s does not speak TLS: --gateway must be the gateway's fleet API (--api_listen, HTTPS, default port 8443)", host)
	case errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		return fmt.Errorf("no answer from the gateway at %s in time (--timeout): check the address and that nothing drops the traffic: %w", host, err)
	case errors.As(err, &dnsErr):
		return fmt.Errorf("cannot find the gateway %s: %w; check --gateway (FLEET_GATEWAY)", c.base.Hostname(), dnsErr)
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return fmt.Errorf("cannot reach the gateway at %s: %w; check --gateway (FLEET_GATEWAY), that the gateway runs with --api_listen on that address, and firewalls", host, opErr.Err)
	case strings.Contains(err.Error(), "tls:"):
		return fmt.Errorf("TLS with the gateway at %s failed: %w; check --gateway and that it is the fleet API (HTTPS)", host, err)
	}
	return fmt.Errorf("ask the gateway at %s: %w", host, err)
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}
