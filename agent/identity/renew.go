package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// ErrNoGateway: the agent was enrolled in process (dev mode, tests), so
// there is no fleet API to recover its credential from.
var ErrNoGateway = errors.New("the agent was not enrolled over a gateway's fleet API: there is nowhere to recover its credential from")

// prove fills p, the proof embedded in req, with the agent's key.
func (id *Identity) prove(req signedRequest, p *protocol.Proof) error {
	kp, err := nkeys.FromSeed(id.Seed)
	if err != nil {
		return fmt.Errorf("the agent's key: %w", err)
	}
	defer kp.Wipe()
	return prove(kp, req, p, time.Now())
}

// Renew asks the gateway for a new credential over the agent's NATS
// connection and makes it the current one (stored, and used from the
// next connect on). request sends a request to a subject and returns the
// reply (nats.Conn.RequestWithContext on the agent's connection, whose
// inbox is the agent's own). A refusal is a *RefusedError.
func (id *Identity) Renew(ctx context.Context, request func(ctx context.Context, subject string, data []byte) ([]byte, error)) error {
	req := &protocol.RenewRequest{Host: id.Enrolment.Host}
	if err := id.prove(req, &req.Proof); err != nil {
		return err
	}
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	answer, err := request(ctx, protocol.RenewSubject(id.Enrolment.Host), data)
	if err != nil {
		return fmt.Errorf("renewal request: %w", err)
	}
	resp, err := parseRenewAnswer(answer)
	if err != nil {
		return err
	}
	if err := id.Replace(resp.JWT); err != nil {
		return fmt.Errorf("renewal: the gateway's answer: %w", err)
	}
	return nil
}

// parseRenewAnswer reads the gateway's answer to a renewal: a
// RenewResponse, or an APIError (a *RefusedError).
func parseRenewAnswer(answer []byte) (*protocol.RenewResponse, error) {
	var reply struct {
		protocol.RenewResponse
		protocol.APIError
	}
	if len(answer) > maxAPIResponseBytes {
		return nil, fmt.Errorf("renewal: the answer is larger than %d bytes", maxAPIResponseBytes)
	}
	if err := json.Unmarshal(answer, &reply); err != nil {
		return nil, fmt.Errorf("renewal: the answer is not the gateway's: %w", err)
	}
	if reply.Code != "" {
		return nil, refused("renewal", &reply.APIError)
	}
	if reply.JWT == "" {
		return nil, errors.New("renewal: the answer holds neither a credential nor an error")
	}
	return &reply.RenewResponse, nil
}

// Recover asks the gateway's fleet API (with the CA pinned at enrolment)
// for a new credential when the current one has expired or NATS refuses
// it, and makes it the current one. The gateway allows it only when the
// operator allowed a recovery for the host (fleetctl agent
// allow-recovery); otherwise it is a *RefusedError whose code is
// protocol.APINoRecovery. An agent enrolled in process or over NATS gets
// ErrNoGateway.
func (id *Identity) Recover(ctx context.Context) error {
	id.mu.Lock()
	e := id.Enrolment
	id.mu.Unlock()
	if e.GatewayURL == "" || e.CAPin == "" {
		return ErrNoGateway
	}
	client, err := newAPIClient(e.GatewayURL, e.CAPin)
	if err != nil {
		return fmt.Errorf("%s: %w", EnrolmentFile, err)
	}
	defer client.close()
	req := &protocol.RecoverRequest{Host: e.Host, CAPin: e.CAPin}
	if err := id.prove(req, &req.Proof); err != nil {
		return err
	}
	var resp protocol.EnrolResponse
	if err := client.post(ctx, "recovery", protocol.RecoverPath, req, &resp); err != nil {
		return err
	}
	if resp.Host != e.Host {
		return fmt.Errorf("recovery: the gateway answered for host %q, not for %q", resp.Host, e.Host)
	}
	id.replaceMu.Lock()
	defer id.replaceMu.Unlock()
	if err := id.store.saveAnswer(e.GatewayURL, e.CAPin, id.PublicKey, &resp, time.Now()); err != nil {
		return fmt.Errorf("recovery: %w", err)
	}
	return id.setJWT(resp.JWT)
}

// Recover loads the identity in stateDir and recovers its credential
// (Identity.Recover).
func Recover(ctx context.Context, stateDir string) (*Identity, error) {
	id, err := Load(stateDir)
	if err != nil {
		return nil, err
	}
	if err := id.Recover(ctx); err != nil {
		return nil, err
	}
	return id, nil
}
