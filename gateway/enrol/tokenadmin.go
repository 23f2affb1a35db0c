package enrol

import (
	"context"
	"fmt"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/textutil"
)

// JoinTokens describes every join token kept, oldest first.
func (s *Service) JoinTokens(ctx context.Context) ([]protocol.TokenInfo, error) {
	all, err := s.tokens.all(ctx)
	if err != nil {
		return nil, err
	}
	now := s.now()
	out := make([]protocol.TokenInfo, 0, len(all))
	for _, e := range all {
		info := e.rec.info(now)
		if e.putBack {
			info.State = protocol.TokenTampered
		}
		out = append(out, info)
	}
	return out, nil
}

// RevokeJoinToken revokes join token id, as by: no host can enrol with
// it any more. It describes the token after, and says whether it has an
// enrol credential (which the fleet account's revocations must now
// hold).
func (s *Service) RevokeJoinToken(ctx context.Context, id, by string) (protocol.TokenInfo, bool, error) {
	t, err := s.tokens.revoke(ctx, id, by, s.now())
	if err != nil {
		return protocol.TokenInfo{}, false, err
	}
	return t.info(s.now()), t.EnrolKey != "", nil
}

// CreateJoinToken creates a join token as req says, made by by, and
// returns it with the commands that join a host with it.
func (s *Service) CreateJoinToken(ctx context.Context, req *protocol.TokenCreateRequest, by string) (*protocol.TokenCreateResponse, error) {
	t, token, err := newTokenRecord(req, by, s.now())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	var natsToken string
	var natsURLs []string
	if req.NATS {
		if natsToken, natsURLs, err = s.natsJoinToken(t, token); err != nil {
			return nil, err
		}
	}
	if err := s.tokens.create(ctx, t); err != nil {
		return nil, err
	}
	s.log.Info("join token created", "token", t.ID, "by", by, "uses", t.Uses, "expires", t.ExpiresAt, "labels", textutil.FormatLabels(t.Labels),
		"name", t.Name, "name_pattern", t.NamePattern, "replace", t.Replace)
	d := s.dial()
	resp := &protocol.TokenCreateResponse{Token: token, Info: t.info(s.now()), GatewayURL: d.APIURL, CAPin: d.APIPin}
	if req.NATS {
		resp.Token, resp.NATSURLs, resp.CAPin = natsToken, natsURLs, s.dial().NATSCAPin
	}
	resp.JoinCommand, resp.InstallCommand = protocol.JoinCommands(resp)
	return resp, nil
}
