package skills

import (
	"crypto/ed25519"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/integration/natstest"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/gwtest"
)

// waitFor bounds every wait in these tests.
const waitFor = 5 * time.Second

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// startJetStream runs a NATS server with JetStream until the test ends.
func startJetStream(t *testing.T) *server.Server {
	t.Helper()
	return natstest.StartJetStream(t, nil)
}

// connectNATS connects to ns as name (gwtest.Connect).
func connectNATS(t *testing.T, ns *server.Server, name string) *nats.Conn {
	return gwtest.Connect(t, ns.ClientURL(), name)
}

// waitUntil waits (up to waitFor) until cond holds.
func waitUntil(t *testing.T, what string, cond func() bool) { gwtest.WaitUntil(t, waitFor, what, cond) }

// agentRequest asks as the agent of the subject's host would: the reply
// comes to that agent's inbox.
func agentRequest(nc *nats.Conn, subject string, data []byte, timeout time.Duration) (*nats.Msg, error) {
	return gwtest.AgentRequest(nc, subjectHost(subject), subject, data, timeout)
}

// testKey is a signing key as the gateway's behaves (Signer): it signs
// with its current key and takes its own signatures by that key and
// the retiring one, during a rotation.
type testKey struct {
	mu             sync.Mutex
	priv, retiring ed25519.PrivateKey
}

func memorySigningKey(priv, retiring ed25519.PrivateKey) *testKey {
	return &testKey{priv: priv, retiring: retiring}
}

// set puts other keys in force, as a reload after a rotation does.
func (k *testKey) set(priv, retiring ed25519.PrivateKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.priv, k.retiring = priv, retiring
}

func (k *testKey) keys() (priv, retiring ed25519.PrivateKey) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.priv, k.retiring
}

func publicOf(priv ed25519.PrivateKey) string {
	pub, _ := priv.Public().(ed25519.PublicKey)
	return protocol.FormatSigningKey(pub)
}

// trusted returns the public keys agents trust, the current one first.
func (k *testKey) trusted() []string {
	priv, retiring := k.keys()
	out := []string{publicOf(priv)}
	if retiring != nil {
		out = append(out, publicOf(retiring))
	}
	return out
}

func (k *testKey) Sign(purpose string, msg []byte) protocol.Signature {
	priv, _ := k.keys()
	return protocol.SignBytes(priv, purpose, msg)
}

func (k *testKey) Resign(purpose string, msg []byte, sig protocol.Signature) protocol.Signature {
	priv, _ := k.keys()
	if sig.Key == publicOf(priv) || protocol.VerifyBytes(k.Verifiable(), purpose, msg, sig) != nil {
		return sig
	}
	return protocol.SignBytes(priv, purpose, msg)
}

func (k *testKey) Verifiable() []string { return slices.Clone(k.trusted()) }

func intp(n int) *int { return &n }
