package natsauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// This file asks the NATS servers which agent credentials are connected
// now (connz over the system account). It is how a host is revoked when
// its record cannot be trusted: what is connected, and with which key,
// is the servers' word, which no user of the fleet account can change. A
// connection counts as a host's only when its user JWT was signed by the
// agent signing key (which names each JWT after its host); the gateway's
// own users and anything else minted with another key are never taken
// for a host.

const (
	// connzPage is how many connections one server lists per answer:
	// each carries its JWT (about 1 KB), so an answer stays well under
	// max_payload.
	connzPage = 256
	// connzFirst bounds the wait for the first server's answer;
	// connzQuiet is how long the gathering waits for more servers after
	// the last answer.
	connzFirst = 3 * time.Second
	connzQuiet = 250 * time.Millisecond
	// maxConnzPages bounds the pages asked of one server.
	maxConnzPages = 400
)

// LiveConn is a live connection made with an agent credential.
type LiveConn struct {
	// Server is the ID of the server the connection is on.
	Server string
	// Host is the name the credential was issued for, Key the user's
	// public key.
	Host, Key string
}

// liveConns lists the live connections of the fleet account whose
// credential the agent signing key issued, on every server that answers.
func (a *Authority) liveConns(ctx context.Context) ([]LiveConn, error) {
	inbox := a.sys.NewRespInbox()
	sub, err := a.sys.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("list connections: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, err := json.Marshal(a.connzQuery(0))
	if err != nil {
		return nil, err
	}
	subject := fmt.Sprintf("$SYS.REQ.ACCOUNT.%s.CONNZ", a.accountPub)
	if err := a.sys.PublishRequest(subject, inbox, body); err != nil {
		return nil, fmt.Errorf("list connections: %w", err)
	}
	var out []LiveConn
	answered := 0
	for wait := connzFirst; ; wait = connzQuiet {
		wctx, cancel := context.WithTimeout(ctx, wait)
		msg, err := sub.NextMsgWithContext(wctx)
		cancel()
		if err != nil {
			if answered == 0 {
				return nil, fmt.Errorf("list connections: no NATS server answered within %s: %w", connzFirst, err)
			}
			return out, ctx.Err()
		}
		answered++
		page, err := decodeConnz(msg.Data)
		if err != nil {
			return nil, err
		}
		out = append(out, a.liveConnsOf(page)...)
		more, err := a.morePages(ctx, page)
		if err != nil {
			return nil, err
		}
		out = append(out, more...)
	}
}

// connzQuery asks for the fleet account's open connections from offset
// on, with their users and JWTs.
func (a *Authority) connzQuery(offset int) *server.ConnzEventOptions {
	limit := a.connzPage
	if limit <= 0 {
		limit = connzPage
	}
	return &server.ConnzEventOptions{ConnzOptions: server.ConnzOptions{Username: true, State: server.ConnOpen, Offset: offset, Limit: limit}}
}

// morePages asks the server that answered page for the rest of its list.
func (a *Authority) morePages(ctx context.Context, page *server.ServerAPIConnzResponse) ([]LiveConn, error) {
	var out []LiveConn
	for n := 1; page.Data.Offset+len(page.Data.Conns) < page.Data.Total && len(page.Data.Conns) > 0; n++ {
		if n > maxConnzPages {
			return out, fmt.Errorf("list connections: server %s lists more than %d pages of connections", page.Server.ID, maxConnzPages)
		}
		q := a.connzQuery(page.Data.Offset + len(page.Data.Conns))
		q.Account = a.accountPub
		body, err := json.Marshal(q)
		if err != nil {
			return nil, err
		}
		rctx, cancel := context.WithTimeout(ctx, pushTimeout)
		msg, err := a.sys.RequestWithContext(rctx, fmt.Sprintf("$SYS.REQ.SERVER.%s.CONNZ", page.Server.ID), body)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("list connections of server %s: %w", page.Server.ID, err)
		}
		if page, err = decodeConnz(msg.Data); err != nil {
			return nil, err
		}
		out = append(out, a.liveConnsOf(page)...)
	}
	return out, nil
}

// decodeConnz decodes one server's connz answer.
func decodeConnz(data []byte) (*server.ServerAPIConnzResponse, error) {
	var resp server.ServerAPIConnzResponse
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, fmt.Errorf("list connections: unreadable answer %.200q: %w", data, err)
	}
	switch {
	case resp.Error != nil:
		return nil, fmt.Errorf("list connections: the NATS server refused: %s", resp.Error.Description)
	case resp.Server == nil || resp.Data == nil:
		return nil, errors.New("list connections: an answer without a server or a list")
	}
	return &resp, nil
}

// liveConnsOf picks the agent connections of page.
func (a *Authority) liveConnsOf(page *server.ServerAPIConnzResponse) []LiveConn {
	signer := publicKey(a.agentSigner)
	var out []LiveConn
	for _, ci := range page.Data.Conns {
		if ci == nil || ci.JWT == "" {
			continue
		}
		uc, err := jwt.DecodeUserClaims(ci.JWT)
		if err != nil || uc.Issuer != signer || uc.IssuerAccount != a.accountPub || uc.Subject != ci.AuthorizedUser {
			continue
		}
		out = append(out, LiveConn{Server: page.Server.ID, Host: uc.Name, Key: uc.Subject})
	}
	return out
}

// LiveKeys returns the agent connections that match, on every server
// that answers (connz over the system account).
func (a *Authority) LiveKeys(ctx context.Context, match func(LiveConn) bool) ([]LiveConn, error) {
	if a.sys == nil || a.sys.Status() == nats.CLOSED {
		return nil, errors.New("list connections: no system connection")
	}
	all, err := a.liveConns(ctx)
	var out []LiveConn
	for _, c := range all {
		if match(c) {
			out = append(out, c)
		}
	}
	return out, err
}
