package integration

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// A host joins with a one-use token, the gateway enrols it, and the
// answer is lost on its way back (a proxy in front of the real fleet API
// cuts the connection once the gateway has answered). The host has its
// key and no credential; the same join again, with the same key and
// token, gets its credential and spends nothing; the credential works.
// Another key with the spent token is refused.
func TestJoinAgainAfterLostAnswerHTTPS(t *testing.T) {
	dataDir := t.TempDir()
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.DataDir, c.APIListen = dataDir, "127.0.0.1:0" }})
	gw := env.Gateway
	tok, err := gw.CreateJoinToken(context.Background(), &protocol.TokenCreateRequest{Name: "web-1", Labels: map[string]string{"env": "prod"}}, "test")
	if err != nil {
		t.Fatal(err)
	}
	proxy := newDropHTTPS(t, loadFleetCA(t, dataDir), gw.APIURL(), protocol.EnrolPath, 1)
	opts := identity.JoinOptions{GatewayURL: proxy.URL, Token: tok.Token, CAPin: tok.CAPin, StateDir: filepath.Join(t.TempDir(), "state")}
	lostAnswerJoin(t, env, opts, tok.Info.ID, func() int { return int(proxy.dropped.Load()) })
}

// The same over NATS: the host reaches only the NATS server, through a
// proxy that drops the gateway's answer to the enrolment request. The
// token's enrol credential still connects for the retry.
func TestJoinAgainAfterLostAnswerNATS(t *testing.T) {
	dataDir := t.TempDir()
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.DataDir, c.NATSTLS, c.APIListen = dataDir, true, "" }})
	gw := env.Gateway
	tok, err := gw.CreateJoinToken(context.Background(), &protocol.TokenCreateRequest{Name: "web-1", Labels: map[string]string{"env": "prod"}, NATS: true}, "test")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(env.NATSURL())
	if err != nil || u.Scheme != "tls" {
		t.Fatalf("NATS URL %s: %v", env.NATSURL(), err)
	}
	upstream := u.Host
	proxy := newDropNATS(t, loadFleetCA(t, dataDir), upstream, 1)
	opts := identity.JoinOptions{NATSURL: proxy.URL, Token: tok.Token, CAPin: tok.CAPin, StateDir: filepath.Join(t.TempDir(), "state")}
	lostAnswerJoin(t, env, opts, tok.Info.ID, func() int { return int(proxy.dropped.Load()) })
}

// lostAnswerJoin joins with opts, whose first answer the proxy drops
// (dropped counts what it dropped), then again; and checks what the
// token, the record and the host's state directory hold.
func lostAnswerJoin(t *testing.T, env *Env, opts identity.JoinOptions, tokenID string, dropped func() int) {
	t.Helper()
	gw := env.Gateway
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err := identity.Join(ctx, opts)
	var refused *identity.RefusedError
	if err == nil || errors.As(err, &refused) || dropped() != 1 {
		t.Fatalf("the join whose answer was lost: %v (%d answers dropped); want a failure to hear the gateway", err, dropped())
	}
	rec, rerr := gw.Agent(ctx, "web-1")
	if rerr != nil {
		t.Fatalf("the gateway did not enrol the host before its answer was lost: %v", rerr)
	}
	if ti := tokenInfo(t, gw, tokenID); ti.State != protocol.TokenSpent {
		t.Fatalf("token after the lost answer: %+v", ti)
	}
	kp, err := identity.Open(opts.StateDir).LoadKey()
	if err != nil {
		t.Fatalf("the host kept no key: %v", err)
	}
	pub, _ := kp.PublicKey()
	if pub != rec.PublicKey {
		t.Fatalf("the record holds key %s, the host %s", rec.PublicKey, pub)
	}
	if _, err := identity.Open(opts.StateDir).LoadJWT(); !errors.Is(err, identity.ErrNotEnrolled) {
		t.Fatalf("a credential after the lost answer: %v", err)
	}

	// The same join again: the credential, no use spent.
	id, enrolled, err := identity.Join(ctx, opts)
	if err != nil || !enrolled {
		t.Fatalf("the join again: %v (enrolled %v)", err, enrolled)
	}
	if id.PublicKey != pub || id.Enrolment.Host != "web-1" || id.Enrolment.Labels["env"] != "prod" {
		t.Errorf("identity after the retry: key %s, %+v", id.PublicKey, id.Enrolment)
	}
	if ti := tokenInfo(t, gw, tokenID); ti.Used != 1 || ti.State != protocol.TokenSpent {
		t.Errorf("token after the retry: %+v", ti)
	}
	token, _ := id.JWT()
	copts := []nats.Option{nats.UserJWTAndSeed(token, string(id.Seed)), nats.CustomInboxPrefix(protocol.AgentInboxPrefix("web-1"))}
	if id.Enrolment.NATSCA != "" {
		copts = append(copts, agentTLS([]byte(id.Enrolment.NATSCA)))
	}
	nc, err := nats.Connect(env.NATSURL(), copts...)
	if err != nil {
		t.Fatalf("the retried credential does not connect: %v", err)
	}
	if err := nc.Publish(protocol.PresenceSubject("web-1"), []byte("{}")); err != nil || nc.Flush() != nil {
		t.Errorf("the retried credential cannot publish the host's presence: %v", err)
	}
	nc.Close()

	// Another host's key with the spent token: refused.
	other := opts
	other.StateDir = filepath.Join(t.TempDir(), "other")
	if _, _, err := identity.Join(ctx, other); !errors.As(err, &refused) || refused.API.Code != protocol.APITokenSpent {
		t.Errorf("another key with the spent token: %v, want token_spent", err)
	}
	if _, err := os.Stat(filepath.Join(other.StateDir, identity.Dir, identity.JWTFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused host has a credential: %v", err)
	}
}

// tokenInfo returns join token id as gw lists it.
func tokenInfo(t *testing.T, gw *gateway.Gateway, id string) protocol.TokenInfo {
	t.Helper()
	list, err := gw.JoinTokens(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, ti := range list {
		if ti.ID == id {
			return ti
		}
	}
	t.Fatalf("no token %s", id)
	return protocol.TokenInfo{}
}
