package integration

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The agent identities of operator mode: each agent is a user of the
// fleet account whose permissions, from the scoped signing key's
// template, cover its own host only. The same checks run against the
// gateway's embedded server and against a nats-server process configured
// from the files of fleet-gateway nats-setup.

func TestAgentConfinedEmbedded(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha", "beta"}})
	checkConfinement(t, env, nil)
}

func TestAgentConfinedExternalServer(t *testing.T) {
	setup := natsSetup(t, t.TempDir())
	url := natsServerProcess(t, setup)
	env := NewEnv(t, Options{Agents: []string{"alpha", "beta"}, ServerURL: url, ServerSetup: setup})
	checkConfinement(t, env, env.GatewayConn())
}

// permErrors collects a connection's asynchronous errors.
type permErrors struct {
	mu   sync.Mutex
	errs []error
}

func (p *permErrors) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errs = append(p.errs, err)
}

// refused reports whether a permissions violation naming subject came.
func (p *permErrors) refused(subject string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, err := range p.errs {
		msg := strings.ToLower(err.Error())
		if strings.Contains(msg, "permission") && strings.Contains(err.Error(), `"`+subject+`"`) {
			return true
		}
	}
	return false
}

// checkConfinement checks, on env with agents alpha and beta running,
// that alpha's identity reaches alpha's subjects and nothing else. sniff,
// when set, is an unrestricted connection that watches for anything the
// server let through.
func checkConfinement(t *testing.T, env *Env, sniff *nats.Conn) {
	url := env.NATSURL()
	if nc, err := nats.Connect(url); err == nil {
		nc.Close()
		t.Fatal("an anonymous client was admitted")
	}
	// alpha's credential with another key's seed: the server's nonce
	// is signed with the wrong key.
	alphaCreds, _ := env.Enrol("alpha")
	stranger, _ := nkeys.CreateUser()
	strangerSeed, _ := stranger.Seed()
	if nc, err := nats.Connect(url, nats.UserJWTAndSeed(alphaCreds.JWT, string(strangerSeed))); err == nil {
		nc.Close()
		t.Fatal("alpha's credential was admitted without alpha's key")
	}

	var perms permErrors
	nc, err := env.AgentConn("alpha", nats.PermissionErrOnSubscribe(true), nats.ErrorHandler(perms.handler))
	if err != nil {
		t.Fatalf("alpha's own credential: %v", err)
	}
	var seen chan *nats.Msg
	if sniff != nil {
		seen = make(chan *nats.Msg, 64)
		for _, s := range []string{"fleet.>", protocol.GatewayInboxPrefix() + ".>", "$KV.>", "$JS.>"} {
			if _, err := sniff.ChanSubscribe(s, seen); err != nil {
				t.Fatal(err)
			}
		}
		_ = sniff.Flush()
	}

	// Its own subjects are fine.
	for _, subj := range protocol.AgentSubscribeAllow("alpha") {
		sub, err := nc.SubscribeSync(subj)
		if err == nil {
			err = nc.Flush()
		}
		if err == nil {
			if _, err = sub.NextMsg(50 * time.Millisecond); errors.Is(err, nats.ErrTimeout) {
				err = nil
			}
		}
		if err != nil {
			t.Errorf("alpha subscribing to its own %s: %v", subj, err)
		}
	}
	// Another host's calls, its inbox, the gateway's replies, every host,
	// JetStream and everything are not.
	for _, subj := range []string{protocol.CallSubject("beta"), protocol.HostSubjects("beta"), protocol.AllHosts(),
		protocol.AgentInboxPrefix("beta") + ".>", protocol.GatewayInboxPrefix() + ".>", "_INBOX.>", protocol.PresenceWildcard(),
		protocol.AuditSubject(), "$JS.API.>", "$KV." + protocol.AgentsBucket + ".>", "fleet.v1.agent.beta.renew", ">"} {
		sub, err := nc.SubscribeSync(subj)
		if err == nil {
			err = nc.Flush()
		}
		if err == nil {
			if _, err = sub.NextMsg(500 * time.Millisecond); errors.Is(err, nats.ErrTimeout) {
				err = nil
			}
		}
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), "permission") {
			t.Errorf("alpha subscribing to %s: err = %v, want a permissions violation", subj, err)
		}
	}

	// Announcing as beta, calling beta, asking the gateway on beta's
	// behalf, forging audit records or JetStream requests: refused.
	forged, _ := json.Marshal(protocol.Announce{Host: "beta", Instance: "forged", Protocol: protocol.Version, HeartbeatMS: 500})
	denied := []string{protocol.PresenceSubject("beta"), protocol.CallSubject("beta"), "fleet.v1.agent.beta.renew", protocol.AuditSubject(),
		"$JS.API.STREAM.INFO." + protocol.AuditStream, "$KV." + protocol.AgentsBucket + ".alpha", protocol.DiscoverSubject()}
	for _, subj := range denied {
		if err := nc.Publish(subj, forged); err != nil {
			t.Fatal(err)
		}
	}
	forgeReply(t, env, nc, &perms)
	_ = nc.Flush()
	for _, subj := range denied {
		waitFor(t, 5*time.Second, "a permissions violation for alpha publishing to "+subj, func() bool { return perms.refused(subj) })
	}
	if h, _ := env.Gateway.Host("beta"); h.Conflict != "" || h.Instance == "forged" {
		t.Fatalf("the forged announce reached the gateway: %+v", h)
	}

	// JetStream is out of reach: the agent records, the audit trail.
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := js.KeyValue(ctx, protocol.AgentsBucket); err == nil {
		t.Error("alpha opened the agent records bucket")
	}
	if _, err := js.Stream(ctx, protocol.AuditStream); err == nil {
		t.Error("alpha read the audit stream's info")
	}

	if seen != nil {
		deadline := time.After(300 * time.Millisecond)
		for {
			select {
			case m := <-seen:
				if strings.Contains(string(m.Data), "forged") || m.Subject == "fleet.v1.agent.beta.renew" {
					t.Errorf("the server let a forged message through: %s %s", m.Subject, m.Data)
				}
				continue
			case <-deadline:
			}
			break
		}
	}
}

// forgeReply has alpha, which answers the gateway's calls to alpha,
// publish a result on the subject where the gateway takes beta's results,
// while a call to beta runs: the server refuses it, and beta's caller
// gets beta's own answer.
func forgeReply(t *testing.T, env *Env, alpha *nats.Conn, perms *permErrors) {
	t.Helper()
	calls, err := alpha.SubscribeSync(protocol.CallSubject("alpha"))
	if err != nil {
		t.Fatal(err)
	}
	_ = alpha.Flush()
	cs := env.Client("", nil)
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "true"}))
	m, err := calls.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("alpha did not see the call to it: %v", err)
	}
	betaReply := m.Reply[:strings.LastIndexByte(m.Reply, '.')+1] + "beta"
	type answer struct {
		text string
		err  error
	}
	result := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "beta", "command": "sleep 0.5; echo beta-real"}})
		if err != nil {
			result <- answer{err: err}
			return
		}
		result <- answer{text: text(res)}
	}()
	res, _ := protocol.EncodeResult(&protocol.Result{Content: []protocol.Content{protocol.Text("forged")}})
	h, body := protocol.Frame{Kind: protocol.KindResult, CallID: "c", Seq: 1, Part: 1, Parts: 1, Data: res}.Encode()
	for range 10 {
		_ = alpha.PublishMsg(&nats.Msg{Subject: betaReply, Header: nats.Header(h), Data: body})
		time.Sleep(20 * time.Millisecond)
	}
	if got := <-result; got.err != nil || got.text != "beta-real\n" {
		t.Errorf("beta's call answered %q (%v), want beta's own output", got.text, got.err)
	}
	_ = alpha.Flush()
	waitFor(t, 5*time.Second, "a permissions violation for alpha publishing on beta's reply subject", func() bool { return perms.refused(betaReply) })
}

// TestLabelsAreTheOperators: labels that access rules and selectors use
// are those the host was enrolled with (or given later), never those it
// announces. gamma, enrolled as env=prod, announces env=staging: the
// developer, who may use staging hosts only, still neither sees it nor
// runs commands on it, until the operator labels it env=staging.
func TestLabelsAreTheOperators(t *testing.T) {
	f := newAuthFleet(t)
	nc, err := f.AgentConn("gamma")
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := json.Marshal(protocol.Announce{Host: "gamma", Instance: "self-labelled", Protocol: protocol.Version, HeartbeatMS: 5000,
		Labels: map[string]string{"env": "staging"}, OS: "linux"})
	for range 3 {
		if err := nc.Publish(protocol.PresenceSubject("gamma"), forged); err != nil {
			t.Fatal(err)
		}
	}
	_ = nc.Flush()
	waitFor(t, 5*time.Second, "the gateway to hear gamma's forged announce", func() bool {
		h, _ := f.Gateway.Host("gamma")
		return h.Conflict != ""
	})
	dev := f.ClientAs("", f.user("dev"))
	if out := mustOK(t, call(t, dev, "hosts", nil)); strings.Contains(out, "gamma") {
		t.Errorf("dev sees gamma, which only claims env=staging:\n%s", out)
	}
	mustErr(t, call(t, dev, "bash", map[string]any{"host": "gamma", "command": "true"}), "unknown host")
	ops := f.ClientAs("", f.user("ops"))
	if out := mustOK(t, call(t, ops, "hosts", map[string]any{"filter": "env=staging"})); strings.Contains(out, "gamma") {
		t.Errorf("the env=staging filter lists gamma:\n%s", out)
	}
	if out := mustOK(t, call(t, ops, "hosts", map[string]any{"filter": "env=prod"})); !strings.Contains(out, "gamma") || !strings.Contains(out, "labels env=prod") {
		t.Errorf("the env=prod filter does not list gamma with its enrolled labels:\n%s", out)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	labels, err := f.Gateway.SetAgentLabels(ctx, "gamma", map[string]string{"env": "staging"}, nil)
	if err != nil || labels["env"] != "staging" {
		t.Fatalf("SetAgentLabels: %v %v", labels, err)
	}
	waitFor(t, 5*time.Second, "dev to see gamma once it is labelled env=staging", func() bool {
		return strings.Contains(mustOK(t, call(t, dev, "hosts", nil)), "gamma")
	})
	if _, err := f.Gateway.SetAgentLabels(ctx, "gamma", map[string]string{"env": "a b"}, nil); err == nil {
		t.Error("a label value with a space was accepted")
	}
	if _, err := f.Gateway.SetAgentLabels(ctx, "nobody", map[string]string{"env": "x"}, nil); !errors.Is(err, gateway.ErrUnknownAgent) {
		t.Errorf("labelling an unknown host: %v", err)
	}
}
