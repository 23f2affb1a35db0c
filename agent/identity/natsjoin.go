package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Enrolment over NATS, for hosts that reach the NATS servers but not the
// gateway's fleet API: the NATS join token (protocol.NATSJoinToken)
// holds the join token and an enrol credential good only for sending
// this token's enrolment request. The agent dials the NATS URL with the
// CA pinned exactly as it dials the fleet API (pinnedTLS: nothing, not
// even the credential, is sent to a server that fails), then sends the
// same EnrolRequest as a NATS request and gets the same answer.

// ParseNATSEnrolURL checks the NATS URL a join over NATS is given:
// tls://HOST:PORT, one server.
func ParseNATSEnrolURL(raw string) (*url.URL, error) {
	raw = strings.TrimSpace(raw)
	want := "want tls://HOST:PORT, the gateway's NATS server (port 4222 by default)"
	if strings.Contains(raw, ",") {
		return nil, fmt.Errorf("NATS URL %q: give one server to enrol at; %s", protocol.Ellipsis(raw, 80), want)
	}
	if err := protocol.ValidateNATSURL(raw); err != nil {
		return nil, fmt.Errorf("%w; %s", err, want)
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return nil, fmt.Errorf("NATS URL %q: %w; %s", protocol.Ellipsis(raw, 80), err, want)
	case !strings.EqualFold(u.Scheme, "tls"):
		return nil, fmt.Errorf("NATS URL %q is not tls://: the join token and its credential would travel without the pinned CA; %s", protocol.Ellipsis(raw, 80), want)
	case u.Hostname() == "" || u.Port() == "":
		return nil, fmt.Errorf("NATS URL %q: no host or port; %s", protocol.Ellipsis(raw, 80), want)
	case u.User != nil:
		return nil, fmt.Errorf("NATS URL %q carries a user name or password: the join token has the credential; %s", protocol.Ellipsis(raw, 80), want)
	}
	return u, nil
}

// natsEnroller sends one token's enrolment requests over NATS.
type natsEnroller struct {
	nc  *nats.Conn
	id  string // the token's id
	url string
}

// dialNATSEnrol dials the NATS server at u with the CA of pin pinned and
// the enrol credential of nt.
func dialNATSEnrol(ctx context.Context, u *url.URL, pin string, nt *protocol.NATSJoinToken) (*natsEnroller, error) {
	id, _, err := protocol.ParseJoinToken(nt.Token)
	if err != nil {
		return nil, err
	}
	dialer := &ctxDialer{ctx: ctx}
	nc, err := nats.Connect(u.String(),
		nats.Secure(pinnedTLS(pin, u.Hostname(), time.Now)),
		nats.UserJWTAndSeed(nt.JWT, nt.Seed),
		nats.CustomInboxPrefix(protocol.EnrolInboxPrefix(id)),
		nats.SetCustomDialer(dialer),
		nats.NoReconnect(), nats.Timeout(apiTimeout/2), nats.Name("fleet-agent join"),
		// The credential is revoked once the token is spent, possibly
		// before the connection is closed: nothing to report then.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		if errors.Is(err, nats.ErrAuthorization) || strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			return nil, fmt.Errorf("enrolment at %s: the NATS server refused the token's credential (%w): the token was used up, revoked or has expired; ask the fleet's operator for a new one (fleetctl token create --nats)", u.Redacted(), err)
		}
		if dialer.err != nil {
			if c := netCause(dialer.err); c != "" {
				return nil, fmt.Errorf("enrolment: %w", &UnreachableError{What: "the gateway's NATS server", URL: u.Redacted(), Resolved: resolved(ctx, u.Hostname()),
					Cause: c, Err: dialer.err, Advice: "check --nats against the gateway's --nats_listen and --advertise, and the firewalls between this host and the gateway"})
			}
		}
		return nil, fmt.Errorf("enrolment at %s: %w", u.Redacted(), err)
	}
	return &natsEnroller{nc: nc, id: id, url: u.Redacted()}, nil
}

// ctxDialer dials with ctx, so a join that is cancelled stops dialling,
// and keeps the last dial's error (nats.Connect reports only that no
// server answered).
type ctxDialer struct {
	ctx context.Context
	err error
}

func (d *ctxDialer) Dial(network, address string) (net.Conn, error) {
	var nd net.Dialer
	conn, err := nd.DialContext(d.ctx, network, address)
	if err != nil {
		d.err = err
	}
	return conn, err
}

func (e *natsEnroller) close() { e.nc.Close() }

// enrol sends req and decodes the answer into out; a refusal is a
// *RefusedError.
func (e *natsEnroller) enrol(ctx context.Context, req *protocol.EnrolRequest, out *protocol.EnrolResponse) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, apiTimeout)
		defer cancel()
	}
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	m, err := e.nc.RequestWithContext(ctx, protocol.EnrolSubject(e.id), data)
	// One request is all the credential is for.
	e.nc.Close()
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("enrolment at %s: no gateway serves enrolment on this NATS server: check --nats, and that the gateway is running", e.url)
	case err != nil:
		return fmt.Errorf("enrolment at %s: %w", e.url, err)
	case len(m.Data) > maxAPIResponseBytes:
		return fmt.Errorf("enrolment at %s: the answer is larger than %d bytes", e.url, maxAPIResponseBytes)
	}
	var apiErr protocol.APIError
	if json.Unmarshal(m.Data, &apiErr) == nil && apiErr.Code != "" {
		return refused("enrolment", &apiErr)
	}
	if err := json.Unmarshal(m.Data, out); err != nil {
		return fmt.Errorf("enrolment at %s: the answer is not the gateway's: %w", e.url, err)
	}
	return nil
}
