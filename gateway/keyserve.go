package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file serves agents the chain of gateway key sets (signing.go,
// protocol/keyset.go) when they ask, on connect, pushes it to every host
// online when it changes, and records in the audit trail the messages
// hosts report they refused (protocol/refusal.go).

const (
	keysQueue    = "fleet-gateway-keys"
	refusedQueue = "fleet-gateway-refused"
)

// agentServices are the gateway's subscriptions for agents' key requests
// and refusal reports, and the goroutine that audits the reports.
type agentServices struct {
	keys, refused *nats.Subscription
	reports       chan *nats.Msg
	stop          context.CancelFunc
	wg            sync.WaitGroup
}

// startAgentServices subscribes to the agents' key requests and refusal
// reports (each in a queue group: one gateway answers, one records).
func (g *Gateway) startAgentServices() error {
	s := &agentServices{reports: make(chan *nats.Msg, 1024)}
	var err error
	if s.keys, err = g.nc.QueueSubscribe(protocol.KeysSubjectAll, keysQueue, g.serveKeys); err != nil {
		return fmt.Errorf("subscribe to key requests: %w", err)
	}
	// A flood of reports beyond the channel is dropped by NATS (a slow
	// consumer), never waited for: each agent limits its own, and the
	// audit trail must not be what a forger fills.
	if s.refused, err = g.nc.ChanQueueSubscribe(protocol.RefusedSubjectAll, refusedQueue, s.reports); err != nil {
		_ = s.keys.Unsubscribe()
		return fmt.Errorf("subscribe to refusal reports: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case m := <-s.reports:
				g.auditRefusal(m)
			}
		}
	})
	g.agentSvc = s
	return nil
}

func (s *agentServices) close() {
	if s == nil {
		return
	}
	_ = s.keys.Unsubscribe()
	_ = s.refused.Unsubscribe()
	s.stop()
	s.wg.Wait()
}

// serveKeys answers a host's request for the key set chain, on its own
// inbox only.
func (g *Gateway) serveKeys(m *nats.Msg) {
	host, ok := agentRequestHost(m.Subject, ".keys")
	if !ok || !protocol.IsAgentReply(host, m.Reply) {
		return
	}
	data, err := g.keyChainJSON()
	if err != nil {
		data, _ = json.Marshal(apiErr(protocol.APIUnavailable, "the gateway's key sets: %v", err))
	}
	if err := m.Respond(data); err != nil {
		g.log.Debug("key sets: the answer could not be sent", "host", host, "err", err)
	}
}

func (g *Gateway) keyChainJSON() ([]byte, error) {
	chain, _ := g.signer.chain()
	if chain.Sets == nil {
		chain.Sets = []protocol.SignedKeySet{}
	}
	return json.Marshal(chain)
}

// agentRequestHost returns the host of a subject fleet.v1.agent.HOST
// followed by suffix.
func agentRequestHost(subject, suffix string) (string, bool) {
	pre := protocol.AgentSubjects("")
	pre = pre[:len(pre)-len(".>")]
	rest, ok := strings.CutPrefix(subject, pre)
	if !ok {
		return "", false
	}
	host, ok := strings.CutSuffix(rest, suffix)
	return host, ok && protocol.ValidateHost(host) == nil
}

// pushKeys sends the key set chain to every host online.
func (g *Gateway) pushKeys() {
	data, err := g.keyChainJSON()
	if err != nil {
		g.log.Error("key sets: not pushed", "err", err)
		return
	}
	n := 0
	for _, h := range g.reg.list("") {
		if !h.Online {
			continue
		}
		if err := g.nc.Publish(protocol.KeysPushSubject(h.Host), data); err == nil {
			n++
		}
	}
	_, serial := g.signer.chain()
	g.log.Info("gateway key sets pushed to the hosts online", "serial", serial, "hosts", n)
}

// keyPushEvery is the least time between two pushes of the key sets to
// one host whose announces show it behind.
const keyPushEvery = 30 * time.Second

// keyPushes remembers when the key sets were last pushed to a host that
// was behind.
type keyPushes struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// keysBehind pushes the key set chain to a host whose announce shows it
// does not trust the gateway's current key yet (it missed a push, or was
// away during a rotation), at most every keyPushEvery. A host that
// trusts no key at all is not one a key set can help.
func (g *Gateway) keysBehind(host string, trusted []string) {
	if len(trusted) == 0 || slices.Contains(trusted, g.signer.currentKeyID()) {
		return
	}
	now := g.now()
	p := &g.keyPushes
	p.mu.Lock()
	if p.last == nil {
		p.last = make(map[string]time.Time)
	}
	if now.Sub(p.last[host]) < keyPushEvery {
		p.mu.Unlock()
		return
	}
	p.last[host] = now
	p.mu.Unlock()
	data, err := g.keyChainJSON()
	if err == nil {
		err = g.nc.Publish(protocol.KeysPushSubject(host), data)
	}
	if err != nil {
		g.log.Debug("key sets: push failed", "host", host, "err", err)
	}
}

// auditRefusal records a host's report of a message it refused.
func (g *Gateway) auditRefusal(m *nats.Msg) {
	host, ok := agentRequestHost(m.Subject, ".refused")
	if !ok || len(m.Data) > protocol.MaxRefusalBytes {
		return
	}
	key, known := g.enrolledKey(host)
	if !known {
		return
	}
	if err := protocol.VerifyRefusal(key, m.Data, m.Header.Get(protocol.HeaderReportSig)); err != nil {
		// Anyone on the account may publish here; only the host's own
		// reports are the host's word.
		g.agentLogs.log(g.log, slog.LevelWarn, host, "dropping a refusal report the host did not sign", "host", host, "err", err)
		return
	}
	var rep protocol.Refusal
	if err := json.Unmarshal(m.Data, &rep); err != nil || rep.Validate() != nil || rep.Host != host {
		g.agentLogs.log(g.log, slog.LevelWarn, host, "dropping a malformed refusal report", "host", host)
		return
	}
	// A record of its own (the trail keeps one record per id): a refused
	// copy of a call must not be taken for the call's record.
	id := newCallID()
	tool := rep.Kind
	if rep.Kind == protocol.MsgCall && rep.Tool != "" {
		tool = rep.Tool
	}
	// The record's time is the gateway's: a host's clock decides nothing
	// in the trail.
	rec := &AuditRecord{Time: g.now().UTC(), CallID: id, Tool: tool, Hosts: []string{host},
		Caller:   AuditCaller{Kind: KindUnverified, Subject: rep.Caller},
		Decision: decisionDenied, Rule: "host envelope check", Reason: string(rep.Reason), Error: rep.Message, Outcome: outcomeRefused,
		Source: "refused by host " + host}
	args := map[string]any{"message": rep.Kind}
	if rep.CallID != "" {
		rec.Target = "call " + rep.CallID
	}
	if rep.KeyID != "" {
		args["key_id"] = rep.KeyID
	}
	if rep.Suppressed > 0 {
		args["suppressed"] = rep.Suppressed
	}
	rec.Args = args
	g.agentLogs.log(g.log, slog.LevelWarn, host, "a host refused a message", "host", host, "kind", rep.Kind, "reason", rep.Reason,
		"call", rep.CallID, "message", rep.Message, "suppressed", rep.Suppressed)
	g.audit.write(rec)
}
