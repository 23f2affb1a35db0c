package identity

import (
	"context"
	"fmt"
	"slices"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Locate asks the gateway's fleet API (with the CA pinned at enrolment),
// with the agent's key, for the NATS URLs to dial now, and stores them
// in the enrolment when they differ from those it holds. It returns the
// URLs and whether they changed. The gateway answers an enrolled host
// whose key holds and that is not revoked; it issues no credential, so no
// recovery needs to be allowed. An agent enrolled in process or over
// NATS gets ErrNoGateway.
func (id *Identity) Locate(ctx context.Context) ([]string, bool, error) {
	id.mu.Lock()
	e := id.Enrolment
	id.mu.Unlock()
	if e.GatewayURL == "" || e.CAPin == "" {
		return nil, false, ErrNoGateway
	}
	client, err := newAPIClient(e.GatewayURL, e.CAPin)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", EnrolmentFile, err)
	}
	defer client.close()
	req := &protocol.LocateRequest{Host: e.Host, CAPin: e.CAPin}
	if err := id.prove(req, &req.Proof); err != nil {
		return nil, false, err
	}
	var resp protocol.LocateResponse
	if err := client.post(ctx, "request for the NATS URLs", protocol.LocatePath, req, &resp); err != nil {
		return nil, false, err
	}
	if resp.Host != e.Host {
		return nil, false, fmt.Errorf("request for the NATS URLs: the gateway answered for host %q, not for %q", resp.Host, e.Host)
	}
	if len(resp.NATSURLs) == 0 {
		return nil, false, fmt.Errorf("request for the NATS URLs: the gateway at %s gave none", e.GatewayURL)
	}
	if slices.Equal(resp.NATSURLs, e.NATSURLs) && resp.NATSCA == e.NATSCA {
		return resp.NATSURLs, false, nil
	}
	id.replaceMu.Lock()
	defer id.replaceMu.Unlock()
	id.mu.Lock()
	next := id.Enrolment
	id.mu.Unlock()
	next.NATSURLs, next.NATSCA = slices.Clone(resp.NATSURLs), resp.NATSCA
	if err := next.validate(); err != nil {
		return nil, false, fmt.Errorf("request for the NATS URLs: the gateway's answer: %w", err)
	}
	if err := id.store.SaveEnrolment(&next); err != nil {
		return nil, false, fmt.Errorf("store the NATS URLs: %w", err)
	}
	id.mu.Lock()
	id.Enrolment = next
	id.mu.Unlock()
	return resp.NATSURLs, true, nil
}
