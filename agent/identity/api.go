package identity

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The client side of the gateway's fleet API: enrolment and recovery over
// HTTPS with the gateway's CA pinned (pin.go).

// apiTimeout bounds one request to the fleet API when the caller's
// context has no deadline.
const apiTimeout = 30 * time.Second

// maxAPIResponseBytes bounds an answer of the fleet API.
const maxAPIResponseBytes = 1 << 20

// ParseGatewayURL checks the gateway URL a join is given and returns it
// in the form enrolment.json keeps: https://HOST[:PORT], nothing else.
// Plain http:// is refused: the token would travel in the clear.
func ParseGatewayURL(raw string) (string, error) {
	raw = strings.TrimSpace(raw)
	want := "want https://HOST[:PORT], the gateway's fleet API (--api_listen, port 8443 by default)"
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("gateway URL %q: %w; %s", protocol.Ellipsis(raw, 80), err, want)
	}
	switch {
	case strings.EqualFold(u.Scheme, "http"):
		return "", fmt.Errorf("gateway URL %q is plain http: the join token would travel in the clear; %s", protocol.Ellipsis(raw, 80), want)
	case !strings.EqualFold(u.Scheme, "https"):
		return "", fmt.Errorf("gateway URL %q: %s", protocol.Ellipsis(raw, 80), want)
	case u.Hostname() == "" || u.Opaque != "":
		return "", fmt.Errorf("gateway URL %q has no host; %s", protocol.Ellipsis(raw, 80), want)
	case u.User != nil:
		return "", fmt.Errorf("gateway URL %q carries a user name or password: the fleet API takes none; %s", protocol.Ellipsis(raw, 80), want)
	case u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return "", fmt.Errorf("gateway URL %q has a path, query or fragment; %s", protocol.Ellipsis(raw, 80), want)
	}
	host := strings.ToLower(u.Hostname())
	if strings.ContainsAny(host, "%[]") {
		return "", fmt.Errorf("gateway URL %q: an IPv6 zone or bracket in the host name; %s", protocol.Ellipsis(raw, 80), want)
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("gateway URL %q: port %q is not 1-65535", protocol.Ellipsis(raw, 80), p)
		}
		host += ":" + p
	}
	return "https://" + host, nil
}

// RefusedError is a request the gateway refused, with what to do about
// it. errors.As finds the gateway's *protocol.APIError in it.
type RefusedError struct {
	// Op is what was refused ("enrolment", "recovery", "renewal").
	Op     string
	API    *protocol.APIError
	Advice string
}

func (e *RefusedError) Error() string {
	msg := fmt.Sprintf("the gateway refused the %s: %s (%s)", e.Op, e.API.Message, e.API.Code)
	if e.Advice != "" {
		msg += "; " + e.Advice
	}
	return msg
}

func (e *RefusedError) Unwrap() error { return e.API }

// NoRecoveryAdvice is what an agent whose credential cannot be recovered
// must do.
const NoRecoveryAdvice = "recovery not allowed: run fleet-agent join with a new token"

// refused wraps the gateway's refusal of op with advice for its code.
func refused(op string, apiErr *protocol.APIError) *RefusedError {
	advice := map[protocol.APICode]string{
		protocol.APITokenUnknown:   "the gateway never made this token: check it was copied whole and that --gateway is the gateway whose fleetctl made it",
		protocol.APITokenExpired:   "ask the fleet's operator for a new token (fleetctl token create)",
		protocol.APITokenSpent:     "the token has been used as often as it allows; ask the fleet's operator for a new one (fleetctl token create --uses N)",
		protocol.APITokenRevoked:   "the token was revoked; ask the fleet's operator for a new one",
		protocol.APINameNotAllowed: "the token does not give this host name: pass --name with a name it allows, or ask for a token for this name",
		protocol.APINameTaken:      "another machine is enrolled under this name: choose another --name, or ask for a token made with --replace NAME to take the name over",
		protocol.APIHostRevoked:    "this host name was revoked by the fleet's operator; only a token made with --replace NAME enrols it again",
		protocol.APIKeyRevoked:     "this machine's key was revoked: delete the identity directory in --state_dir so a new key is made, and join with a new token",
		protocol.APIClockSkew:      "set this machine's clock (NTP) and try again",
		protocol.APIReplayed:       "the request's nonce was seen before; try again (every request gets a new one)",
		protocol.APIBadSignature:   "the gateway could not verify this agent's signature: upgrade fleet-agent to the gateway's version",
		protocol.APIWrongCA:        "the CA pin the agent checked is not the gateway's: check --ca_pin against fleetctl token create",
		protocol.APINoRecovery:     NoRecoveryAdvice + " (or ask the fleet's operator for fleetctl agent allow-recovery NAME)",
		protocol.APIUnknownHost:    "the gateway has no record of this host: run fleet-agent join with a new token",
		protocol.APIBadRequest:     "the gateway could not read the request: upgrade fleet-agent to the gateway's version",
		protocol.APIUnavailable:    "the gateway cannot serve this now (its NATS or storage is down); try again later",
		protocol.APIUnauthorized:   "the fleet API refused the caller",
		protocol.APIForbidden:      "the fleet API refused the caller",
		protocol.APINotFound:       "the URL is not the gateway's fleet API: check --gateway",
		protocol.APIGatewayMisconfigured: "the gateway's addresses are wrong for this host (nothing was spent): its operator fixes the gateway's flags as the message says, " +
			"then this is tried again",
	}[apiErr.Code]
	return &RefusedError{Op: op, API: apiErr, Advice: advice}
}

// apiClient posts requests to one gateway's fleet API with its CA
// pinned.
type apiClient struct {
	base string // https://HOST[:PORT]
	pin  string
	http *http.Client
}

func newAPIClient(gatewayURL, pin string) (*apiClient, error) {
	base, err := ParseGatewayURL(gatewayURL)
	if err != nil {
		return nil, err
	}
	if !protocol.ValidCAPin(pin) {
		return nil, fmt.Errorf("CA pin %q: want sha256: and 64 lowercase hex digits, as fleetctl token create prints it", protocol.Ellipsis(pin, 80))
	}
	u, _ := url.Parse(base)
	tr := &http.Transport{
		// A proxy sees only the CONNECT: TLS (with the pin) is end to end.
		Proxy:               http.ProxyFromEnvironment,
		TLSClientConfig:     pinnedTLS(pin, u.Hostname(), time.Now),
		TLSHandshakeTimeout: 15 * time.Second,
		ForceAttemptHTTP2:   true,
	}
	return &apiClient{base: base, pin: pin, http: &http.Client{
		Transport: tr,
		// A redirect would carry the token to a URL nobody pinned.
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errors.New("the fleet API answered with a redirect, which the agent does not follow: check --gateway")
		},
	}}, nil
}

func (c *apiClient) close() { c.http.CloseIdleConnections() }

// post sends body to path and decodes the answer into out; a refusal is
// a *RefusedError for op.
func (c *apiClient) post(ctx context.Context, op, path string, body, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, apiTimeout)
		defer cancel()
	}
	data, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(data))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		if uerr := apiUnreachable(ctx, c.base, err); uerr != nil {
			return fmt.Errorf("%s: %w", op, uerr)
		}
		return fmt.Errorf("%s at %s: %w", op, c.base, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIResponseBytes+1))
	if err != nil {
		return fmt.Errorf("%s at %s: reading the answer: %w", op, c.base, err)
	}
	if len(answer) > maxAPIResponseBytes {
		return fmt.Errorf("%s at %s: the answer is larger than %d bytes", op, c.base, maxAPIResponseBytes)
	}
	if resp.StatusCode != http.StatusOK {
		var apiErr protocol.APIError
		if json.Unmarshal(answer, &apiErr) != nil || apiErr.Code == "" {
			return fmt.Errorf("%s at %s: HTTP %s, not an answer of the fleet API (%q): check --gateway", op, c.base, resp.Status, protocol.Ellipsis(string(answer), 80))
		}
		return refused(op, &apiErr)
	}
	if err := json.Unmarshal(answer, out); err != nil {
		return fmt.Errorf("%s at %s: the answer is not the fleet API's: %w", op, c.base, err)
	}
	return nil
}

// signedRequest is a request that carries a proof of possession.
type signedRequest interface{ SigningBytes() []byte }

// prove fills p, the proof embedded in req, for the key of kp at now: the
// public key, a fresh nonce, the time, and kp's signature over req's
// signing bytes (base64url without padding).
func prove(kp nkeys.KeyPair, req signedRequest, p *protocol.Proof, now time.Time) error {
	pub, err := kp.PublicKey()
	if err != nil {
		return err
	}
	*p = protocol.Proof{PublicKey: pub, Nonce: protocol.NewNonce(), Time: now.UTC()}
	sig, err := kp.Sign(req.SigningBytes())
	if err != nil {
		return fmt.Errorf("sign the request: %w", err)
	}
	p.Signature = base64.RawURLEncoding.EncodeToString(sig)
	return nil
}

// checkCredential makes sure token is a user JWT for the key pub and
// host, and returns its claims.
func checkCredential(token, pub, host string) (*jwt.UserClaims, error) {
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, fmt.Errorf("not a user JWT: %w", err)
	}
	if uc.Subject != pub {
		return nil, fmt.Errorf("the credential is for key %s, not for this agent's key %s", uc.Subject, pub)
	}
	if uc.Name != host {
		return nil, fmt.Errorf("the credential is for host %q, but the agent enrolled as %q", uc.Name, host)
	}
	return uc, nil
}
