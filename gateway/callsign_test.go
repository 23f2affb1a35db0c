package gateway

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
)

var (
	testKeysOnce sync.Once
	testGWKey    *signing.Keys
	testAgentKP  nkeys.KeyPair
	testAgentPub string
)

func initTestKeys() {
	testKeysOnce.Do(func() {
		_, priv, err := ed25519.GenerateKey(nil)
		if err != nil {
			panic(err)
		}
		testGWKey = signing.New(priv, nil)
		if testAgentKP, err = nkeys.CreateUser(); err != nil {
			panic(err)
		}
		testAgentPub, _ = testAgentKP.PublicKey()
	})
}

// testSigningKey is a signing key made in a test's directory.
func testSigningKey(t *testing.T) *signing.Keys {
	t.Helper()
	k, err := signing.Open(t.TempDir()+"/gateway.key", true)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// testGatewayKey is the signing key of the routers of these tests; the
// hosts they announce trust it.
func testGatewayKey() *signing.Keys {
	initTestKeys()
	return testGWKey
}

// testHostKey says every host's enrolled key is the fake agents'.
func testHostKey(string) (string, bool) {
	initTestKeys()
	return testAgentPub, true
}

// testReceipt is a fake agent's receipt of res, encoded as data.
func testReceipt(t *testing.T, host string, res *protocol.Result, data []byte) string {
	t.Helper()
	initTestKeys()
	r := protocol.NewReceipt(host, res, data, time.Now(), time.Now(), nil)
	if err := r.Sign(testAgentPub, testAgentKP.Sign); err != nil {
		t.Fatal(err)
	}
	return r.Header()
}

func openWith(k *signing.Keys) protocol.KeyLookup {
	return func(id string) (ed25519.PublicKey, bool) {
		for _, key := range k.Verifiable() {
			pub, _ := protocol.ParseSigningKey(key)
			if protocol.KeyID(pub) == id {
				return pub, true
			}
		}
		return nil, false
	}
}

// TestRouterSignsMessages: calls, cancels and fetches carry envelopes
// signed by the gateway's key that name the host, the call, the reply
// subject, the exact body and the caller.
func TestRouterSignsMessages(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", time.Second)
	fa := newFakeAgent(t, ns, "web-1")
	req := bashCall("web-1", "echo hi")
	req.Caller = protocol.Caller{Issuer: "https://id.example", Subject: "alice", ClientID: "cli", Groups: []string{"sre"}}
	ctx, cancel := context.WithCancel(context.Background())
	done := startCall(ctx, r, req, nil)
	rc := recv(t, fa.calls, "call")
	c, err := protocol.OpenEnvelope(rc.parts[0].Auth, openWith(testGatewayKey()))
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != protocol.MsgCall || c.Host != "web-1" || c.Instance != "i-web-1" || c.CallID != rc.call.ID || c.Tool != "bash" || c.Reply != rc.reply ||
		c.Caller.Subject != "alice" || c.Caller.ClientID != "cli" || c.Caller.Groups[0] != "sre" || c.Caller.Issuer != "https://id.example" {
		t.Errorf("claims %+v do not describe the call %+v", c, rc.call)
	}
	if err := checkBody(c, rc.raw); err != nil {
		t.Error(err)
	}
	if lt := c.Expires.Sub(c.IssuedAt); lt != protocol.EnvelopeLifetime {
		t.Errorf("envelope lifetime %s", lt)
	}
	// Silence: the router fetches, signed.
	fe := recv(t, fa.fetches, "fetch")
	if fe.auth == "" {
		t.Fatal("the fetch is not signed")
	}
	fc, err := protocol.OpenEnvelope(fe.auth, openWith(testGatewayKey()))
	if err != nil || fc.Kind != protocol.MsgFetch || fc.Instance != "i-web-1" || fc.CallID != rc.call.ID || fc.Reply != fe.reply {
		t.Errorf("fetch envelope %+v, %v", fc, err)
	}
	cancel()
	<-done
	ca := recv(t, fa.cancels, "cancel")
	cc, err := protocol.OpenEnvelope(ca.auth, openWith(testGatewayKey()))
	if err != nil || cc.Kind != protocol.MsgCancel || cc.Instance != "i-web-1" || cc.CallID != rc.call.ID {
		t.Errorf("cancel envelope %+v, %v", cc, err)
	}
}

func checkBody(c *protocol.Claims, body []byte) error {
	if int64(len(body)) != c.BodySize {
		return &protocol.EnvelopeError{Msg: "size differs"}
	}
	return nil
}

// TestRouterRefusesBadReceipts: a result without a receipt, with one
// signed by another key, or one that describes another result, is not
// passed on; the receipt's problem is recorded.
func TestRouterRefusesBadReceipts(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 2*time.Second)
	fa := newFakeAgent(t, ns, "web-1")
	other, _ := nkeys.CreateUser()
	otherPub, _ := other.PublicKey()
	for _, tc := range []struct {
		name    string
		receipt func(res *protocol.Result, data []byte) string
		want    string
	}{
		{"none", func(*protocol.Result, []byte) string { return "" }, "no receipt"},
		{"another key", func(res *protocol.Result, data []byte) string {
			rc := protocol.NewReceipt("web-1", res, data, time.Now(), time.Now(), nil)
			_ = rc.Sign(otherPub, other.Sign)
			return rc.Header()
		}, "not the host's enrolled key"},
		{"another result", func(res *protocol.Result, data []byte) string {
			return testReceipt(t, "web-1", res, append(data, 'x'))
		}, "another digest"},
		{"another host", func(res *protocol.Result, data []byte) string { return testReceipt(t, "web-2", res, data) }, "on web-2"},
	} {
		req := bashCall("web-1", "true")
		rec := &audit.Receipt{}
		req.Receipt = rec
		done := startCall(context.Background(), r, req, nil)
		rc := recv(t, fa.calls, "call")
		res := &protocol.Result{CallID: rc.call.ID, Content: []protocol.Content{protocol.Text("ok")}}
		data, _ := protocol.EncodeResult(res)
		f := protocol.Frame{Kind: protocol.KindResult, CallID: res.CallID, Seq: 1, Part: 1, Parts: 1, Data: data, Receipt: tc.receipt(res, data)}
		fa.send(t, rc.reply, f)
		out := <-done
		wantHostError(t, out.err, HostRefused, "without a valid receipt", tc.want)
		if rec.Verified || !strings.Contains(rec.Problem, tc.want) {
			t.Errorf("%s: recorded %+v", tc.name, rec)
		}
	}
	// A good one is recorded as verified.
	req := bashCall("web-1", "true")
	rec := &audit.Receipt{}
	req.Receipt = rec
	done := startCall(context.Background(), r, req, nil)
	rc := recv(t, fa.calls, "call")
	fa.sendResult(t, rc.reply, &protocol.Result{CallID: rc.call.ID, IsError: true, Content: []protocol.Content{protocol.Text("x")}})
	if out := <-done; out.err != nil || !rec.Verified || rec.Outcome != protocol.OutcomeToolError || rec.Key != testAgentPub {
		t.Errorf("a good receipt: %v, %+v", out.err, rec)
	}
}

// TestRouterUntrustedHosts: nothing is sent to a host that announces no
// key, or none of the gateway's; during a rotation a host that trusts
// only the old key gets messages signed by it.
func TestRouterUntrustedHosts(t *testing.T) {
	ns := startNATS(t, 0)
	r, reg := newTestRouter(t, ns, "web-1", 2*time.Second)
	old := announceOf("old-1")
	old.TrustedKeys = nil
	announce(t, reg, old)
	_, err := r.call(context.Background(), bashCall("old-1", "true"), nil)
	wantHostError(t, err, HostUntrusted, "cannot check the gateway's signatures", "enrol it again")
	behind := announceOf("behind-1")
	behind.TrustedKeys = []string{"someOtherKey"}
	announce(t, reg, behind)
	_, err = r.call(context.Background(), bashCall("behind-1", "true"), nil)
	wantHostError(t, err, HostUntrusted, "does not trust the gateway's signing key", "someOtherKey")

	_, cur, _ := ed25519.GenerateKey(nil)
	_, prev, _ := ed25519.GenerateKey(nil)
	k := signing.New(cur, prev)
	if env := k.EnvelopeSigner([]string{protocol.NewEnvelopeSigner(prev).KeyID()}); env == nil || env.KeyID() != protocol.NewEnvelopeSigner(prev).KeyID() {
		t.Error("a host that trusts only the retiring key does not get it")
	}
	both := []string{protocol.NewEnvelopeSigner(prev).KeyID(), protocol.NewEnvelopeSigner(cur).KeyID()}
	if env := k.EnvelopeSigner(both); env.KeyID() != k.CurrentKeyID() {
		t.Error("a host that trusts both keys does not get the current one")
	}
}

// TestRouterHostRefusal: the host's report that it refused a call ends
// the call at once with its reason; a report from another host, or one
// the host's key did not sign (anyone on the account may publish one),
// does not.
func TestRouterHostRefusal(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 10*time.Second)
	fa := newFakeAgent(t, ns, "web-1")
	done := startCall(context.Background(), r, bashCall("web-1", "true"), nil)
	rc := recv(t, fa.calls, "call")
	_, rogue, _ := ed25519.GenerateKey(nil)
	reason := protocol.RefusedFuture
	report := func(host, msg string, sign func([]byte) []byte) {
		data, _ := json.Marshal(protocol.Refusal{Host: host, Kind: protocol.MsgCall, Reason: reason,
			Message: msg, CallID: rc.call.ID, At: time.Now()})
		m := &nats.Msg{Subject: protocol.RefusedSubject(host), Data: data, Header: nats.Header{}}
		if sign != nil {
			m.Header.Set(protocol.HeaderReportSig, base64.RawURLEncoding.EncodeToString(sign(protocol.RefusalSigningBytes(data))))
		}
		if err := fa.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	byHost := func(b []byte) []byte { sig, _ := testAgentKP.Sign(b); return sig }
	// Another host's word about web-1's call, unsigned and foreign-signed
	// reports, then web-1's: in that order from one connection, so had
	// any of the first counted, it would have ended the call.
	start := time.Now()
	report("web-2", "from web-2", byHost)
	report("web-1", "unsigned", nil)
	report("web-1", "signed by another key", func(b []byte) []byte { return ed25519.Sign(rogue, b) })
	// Another process of web-1 (one a restart replaces) refusing the
	// call that was not signed for it does not end it either.
	reason = protocol.RefusedOtherInstance
	report("web-1", "the process before", byHost)
	reason = protocol.RefusedFuture
	report("web-1", "clocks apart", byHost)
	out := <-done
	he := wantHostError(t, out.err, HostRefused, "refused the bash call", "future", "clocks apart")
	if !strings.Contains(he.Msg, "clocks apart") {
		t.Errorf("a report the host did not sign ended the call: %v", he)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the refusal took %s to end the call", time.Since(start))
	}
}
