package agent

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The gateway key of these tests: the agents they run trust it, and the
// tests sign what they send with it, as a gateway does.
var testGatewayPriv = sync.OnceValue(func() ed25519.PrivateKey {
	_, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		panic(err)
	}
	return priv
})

func testGatewayKeys() []string {
	return []string{protocol.FormatSigningKey(testGatewayPriv().Public().(ed25519.PublicKey))}
}

func testSigner() *protocol.EnvelopeSigner { return protocol.NewEnvelopeSigner(testGatewayPriv()) }

// testInstances are the instances of the agents the tests started, by
// host: what a gateway learns from their announces.
var testInstances sync.Map

// trackInstance records a's instance for the envelopes tests sign.
func trackInstance(t *testing.T, a *Agent) {
	host := a.cfg.Name
	testInstances.Store(host, a.instance)
	t.Cleanup(func() { testInstances.CompareAndDelete(host, a.instance) })
}

// instanceOf is the instance of the test agent of host ("none" when no
// agent of that name was started).
func instanceOf(host string) string {
	if v, ok := testInstances.Load(host); ok {
		return v.(string)
	}
	return "none"
}

// envelope returns the HeaderAuth value of a message of kind about call
// id to host with body, answered on reply, issued now.
func envelope(kind, host, id, tool, reply string, body []byte, timeoutMS int64, caller protocol.CallerClaims) string {
	now := time.Now()
	c := protocol.Claims{Kind: kind, Host: host, Instance: instanceOf(host), CallID: id, MsgID: protocol.NewMsgID(), Tool: tool, Reply: reply,
		BodySHA256: sha256.Sum256(body), BodySize: int64(len(body)), TimeoutMS: timeoutMS, Caller: caller,
		IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime)}
	return testSigner().Sign(&c)
}

// callFrames encodes call as a gateway sends it, in parts of at most
// size bytes (0: one part when it fits), the first carrying its signed
// envelope for reply.
func callFrames(t *testing.T, call protocol.Call, reply string, size int) []protocol.Frame {
	t.Helper()
	sign := func(n int64, sum [sha256.Size]byte) (string, error) {
		now := time.Now()
		c := protocol.Claims{Kind: protocol.MsgCall, Host: call.Host, Instance: instanceOf(call.Host), CallID: call.ID, MsgID: protocol.NewMsgID(), Tool: call.Tool, Reply: reply,
			BodySHA256: sum, BodySize: n, TimeoutMS: call.TimeoutMS, Caller: call.Caller.Claims(), IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime)}
		return testSigner().Sign(&c), nil
	}
	var frames []protocol.Frame
	err := protocol.EncodeCallParts(&call, size, sign, func(part, parts int, auth string, data []byte) error {
		frames = append(frames, protocol.Frame{Kind: protocol.KindCall, CallID: call.ID, Seq: uint64(part), Part: part, Parts: parts,
			Auth: auth, Data: append([]byte(nil), data...)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return frames
}

// publishFrames sends frames to host's call subject with reply.
func publishFrames(t *testing.T, nc *nats.Conn, host, reply string, frames []protocol.Frame) {
	t.Helper()
	for _, f := range frames {
		h, body := f.Encode()
		if err := nc.PublishMsg(&nats.Msg{Subject: protocol.CallSubject(host), Reply: reply, Header: nats.Header(h), Data: body}); err != nil {
			t.Fatal(err)
		}
	}
}

// refusals subscribes to host's refusal reports.
func refusals(t *testing.T, nc *nats.Conn, host string) <-chan protocol.Refusal {
	t.Helper()
	ch := make(chan protocol.Refusal, 64)
	sub, err := nc.Subscribe(protocol.RefusedSubject(host), func(m *nats.Msg) {
		var r protocol.Refusal
		if json.Unmarshal(m.Data, &r) == nil {
			ch <- r
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// nextRefusal returns host's next refusal report.
func nextRefusal(t *testing.T, ch <-chan protocol.Refusal) protocol.Refusal {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no refusal report within 10s")
		return protocol.Refusal{}
	}
}
