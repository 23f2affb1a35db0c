package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file serves agents the chain of gateway key sets (signing.go,
// protocol/keyset.go) when they ask, on connect, pushes it to every host
// online when it changes, and writes to the audit trail the records the
// router makes of the messages hosts report they refused (refusals.go).

const keysQueue = "fleet-gateway-keys"

// unsentSummaryEvery is how often the reports hosts sent about messages
// no call of this gateway sent them are summarised in the trail.
const unsentSummaryEvery = 10 * time.Second

// agentServices are the gateway's subscription for agents' key requests,
// and the goroutine that writes the refusal records.
type agentServices struct {
	keys *nats.Subscription
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// startAgentServices subscribes to the agents' key requests (in a queue
// group: one gateway answers) and starts writing refusal records.
func (g *Gateway) startAgentServices() error {
	s := &agentServices{}
	var err error
	// On the connection of host requests (renew.go): a host that floods
	// them delays nothing on the main connection.
	if s.keys, err = g.hostNC.QueueSubscribe(protocol.KeysSubjectAll, keysQueue, g.serveKeys); err != nil {
		return fmt.Errorf("subscribe to key requests: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.wg.Go(func() { g.writeRefusals(ctx) })
	g.agentSvc = s
	return nil
}

// writeRefusals writes the router's refusal records, and every
// unsentSummaryEvery the summaries of reports about messages no call of
// this gateway sent, until ctx ends.
func (g *Gateway) writeRefusals(ctx context.Context) {
	tick := time.NewTicker(unsentSummaryEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case rec := <-g.router.refusalRecords:
			g.audit.Write(rec)
		case <-tick.C:
			now := g.now()
			for host, t := range g.bounds.takeUnsent() {
				g.audit.Write(unsentRecord(host, t, now))
			}
		}
	}
}

func (s *agentServices) close() {
	if s == nil {
		return
	}
	_ = s.keys.Unsubscribe()
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
