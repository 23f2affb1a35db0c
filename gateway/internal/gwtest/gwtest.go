// Package gwtest holds what the tests of the gateway and of its
// subpackages share: waiting on a condition, a NATS connection of a test,
// and a request made as a host's agent makes it (its reply to the host's
// own inbox, the only one the gateway answers agents on). Only tests
// import it.
package gwtest

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// WaitUntil waits, up to within, until cond holds, and fails t naming
// what it waited for when it does not.
func WaitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Connect connects to the NATS server at url as name, without
// reconnecting, and closes the connection when the test ends.
func Connect(t testing.TB, url, name string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.Name(name), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// AgentRequest sends data on subject as host's agent would, its reply to
// an inbox under host's agent inbox prefix, and waits up to timeout for
// the reply. No responder is nats.ErrNoResponders.
func AgentRequest(nc *nats.Conn, host, subject string, data []byte, timeout time.Duration) (*nats.Msg, error) {
	inbox := protocol.AgentInboxPrefix(host) + "." + nats.NewInbox()[len(nats.InboxPrefix):]
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, data); err != nil {
		return nil, err
	}
	m, err := sub.NextMsg(timeout)
	if errors.Is(err, nats.ErrTimeout) {
		return nil, err
	}
	if err == nil && len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		return nil, nats.ErrNoResponders
	}
	return m, err
}
