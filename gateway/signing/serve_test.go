package signing

import (
	"crypto/ed25519"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/integration/natstest"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestKeyServer: a host's request for the key sets is answered on its
// own inbox only; Push sends the chain to every host online; Behind
// pushes it to a host that does not trust the current key, at most once
// every keyPushEvery, and never to one that trusts it or trusts none.
func TestKeyServer(t *testing.T) {
	ns := natstest.Start(t, nil)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	dir := t.TempDir()
	if _, err := Open(dir+"/"+KeyFile, true); err != nil {
		t.Fatal(err)
	}
	if _, err := Rotate(dir+"/"+KeyFile, time.Now()); err != nil {
		t.Fatal(err)
	}
	keys, err := Open(dir+"/"+KeyFile, false)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	online := []string{"web-1", "web-2"}
	s := NewKeyServer(keys, nc, func() []string { return online }, func() time.Time { return now }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Serve(nc); err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	// A request answered on the host's inbox.
	inbox := protocol.AgentInboxPrefix("web-1") + ".x1"
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(protocol.KeysSubject("web-1"), inbox, nil); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var chain protocol.KeySetChain
	if err := json.Unmarshal(m.Data, &chain); err != nil || len(chain.Sets) != 1 || chain.Sets[0].Set.Serial != 1 {
		t.Fatalf("answer %s: %v", m.Data, err)
	}
	// Another host's inbox: no answer.
	other := protocol.AgentInboxPrefix("web-2") + ".x2"
	osub, err := nc.SubscribeSync(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(protocol.KeysSubject("web-1"), other, nil); err != nil {
		t.Fatal(err)
	}
	// Requests are served in order: once the next one is answered, the
	// one before was dealt with.
	if err := nc.PublishRequest(protocol.KeysSubject("web-1"), inbox, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := osub.Pending(); n != 0 {
		t.Fatal("answered on another host's inbox")
	}

	pushes, err := nc.SubscribeSync(protocol.KeysPushSubject("*"))
	if err != nil {
		t.Fatal(err)
	}
	s.Push()
	for range online {
		if _, err := pushes.NextMsg(5 * time.Second); err != nil {
			t.Fatalf("push: %v", err)
		}
	}

	_, old, _ := ed25519.GenerateKey(nil)
	behind := []string{protocol.NewEnvelopeSigner(old).KeyID()}
	s.Behind("web-3", nil)                           // trusts none: nothing
	s.Behind("web-3", []string{keys.CurrentKeyID()}) // current: nothing
	s.Behind("web-3", behind)                        // pushed
	s.Behind("web-3", behind)                        // too soon: nothing
	now = now.Add(keyPushEvery)
	s.Behind("web-3", behind) // pushed again
	// A message after them all tells when every push has arrived.
	if err := nc.Publish(protocol.KeysPushSubject("end"), nil); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		m, err := pushes.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject == protocol.KeysPushSubject("end") {
			break
		}
		if m.Subject != protocol.KeysPushSubject("web-3") {
			t.Fatalf("a push to %s", m.Subject)
		}
		n++
	}
	if n != 2 {
		t.Errorf("%d pushes to a host behind, want 2", n)
	}
}
