package signing

import (
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

// This file serves agents the chain of gateway key sets (keys.go,
// protocol/keyset.go) when they ask, on connect, and pushes it to every
// host online when it changes, or to one host whose announces show it
// behind.

const keysQueue = "fleet-gateway-keys"

// keyPushEvery is the least time between two pushes of the key sets to
// one host whose announces show it behind.
const keyPushEvery = 30 * time.Second

// KeyServer serves the key set chain of Keys to agents. The gateway makes
// one when it connects to NATS, and closes it on shutdown.
type KeyServer struct {
	keys *Keys
	nc   *nats.Conn
	// online lists the hosts online (the registry's).
	online func() []string
	now    func() time.Time
	log    *slog.Logger

	sub *nats.Subscription

	// mu guards last: when the key sets were last pushed to a host that
	// was behind.
	mu   sync.Mutex
	last map[string]time.Time
}

// NewKeyServer returns the server of keys' chain, which pushes on nc to
// the hosts online lists.
func NewKeyServer(keys *Keys, nc *nats.Conn, online func() []string, now func() time.Time, log *slog.Logger) *KeyServer {
	return &KeyServer{keys: keys, nc: nc, online: online, now: now, log: log, last: make(map[string]time.Time)}
}

// Serve subscribes on conn to the agents' key requests (in a queue group:
// one gateway answers).
func (s *KeyServer) Serve(conn *nats.Conn) error {
	sub, err := conn.QueueSubscribe(protocol.KeysSubjectAll, keysQueue, s.serveKeys)
	if err != nil {
		return fmt.Errorf("subscribe to key requests: %w", err)
	}
	s.sub = sub
	return nil
}

// Close ends the subscription of Serve (a nil server or none: nothing).
func (s *KeyServer) Close() {
	if s == nil || s.sub == nil {
		return
	}
	_ = s.sub.Unsubscribe()
}

// serveKeys answers a host's request for the key set chain, on its own
// inbox only.
func (s *KeyServer) serveKeys(m *nats.Msg) {
	host, ok := agentRequestHost(m.Subject, ".keys")
	if !ok || !protocol.IsAgentReply(host, m.Reply) {
		return
	}
	data, err := s.chainJSON()
	if err != nil {
		data, _ = json.Marshal(&protocol.APIError{Code: protocol.APIUnavailable, Message: fmt.Sprintf("the gateway's key sets: %v", err)})
	}
	if err := m.Respond(data); err != nil {
		s.log.Debug("key sets: the answer could not be sent", "host", host, "err", err)
	}
}

func (s *KeyServer) chainJSON() ([]byte, error) {
	chain, _ := s.keys.Chain()
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

// Push sends the key set chain to every host online.
func (s *KeyServer) Push() {
	data, err := s.chainJSON()
	if err != nil {
		s.log.Error("key sets: not pushed", "err", err)
		return
	}
	n := 0
	for _, host := range s.online() {
		if err := s.nc.Publish(protocol.KeysPushSubject(host), data); err == nil {
			n++
		}
	}
	_, serial := s.keys.Chain()
	s.log.Info("gateway key sets pushed to the hosts online", "serial", serial, "hosts", n)
}

// Behind pushes the key set chain to a host whose announce shows it
// does not trust the gateway's current key yet (it missed a push, or was
// away during a rotation), at most every keyPushEvery. A host that
// trusts no key at all is not one a key set can help.
func (s *KeyServer) Behind(host string, trusted []string) {
	if len(trusted) == 0 || slices.Contains(trusted, s.keys.CurrentKeyID()) {
		return
	}
	now := s.now()
	s.mu.Lock()
	if now.Sub(s.last[host]) < keyPushEvery {
		s.mu.Unlock()
		return
	}
	s.last[host] = now
	s.mu.Unlock()
	data, err := s.chainJSON()
	if err == nil {
		err = s.nc.Publish(protocol.KeysPushSubject(host), data)
	}
	if err != nil {
		s.log.Debug("key sets: push failed", "host", host, "err", err)
	}
}
