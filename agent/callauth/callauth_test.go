package callauth

import (
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

type fixture struct {
	priv   ed25519.PrivateKey
	signer *protocol.EnvelopeSigner
	key    string
	now    time.Time
	v      *Verifier
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{priv: priv, signer: protocol.NewEnvelopeSigner(priv), key: protocol.FormatSigningKey(pub), now: time.Now()}
	f.v, err = New(Config{Host: "web-1", Instance: "i-1", Keys: protocol.KeyState{Keys: []string{f.key}}, Started: f.now, Now: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) claims(body []byte) *protocol.Claims {
	return &protocol.Claims{Kind: protocol.MsgCall, Host: "web-1", Instance: "i-1", CallID: "c1", MsgID: protocol.NewMsgID(), Tool: "bash",
		Reply: "_INBOX__gw.x.web-1", BodySHA256: sha256.Sum256(body), BodySize: int64(len(body)),
		Caller: protocol.CallerClaims{Subject: "alice"}, IssuedAt: f.now, Expires: f.now.Add(protocol.EnvelopeLifetime)}
}

func reason(t *testing.T, err error) protocol.RefusalReason {
	t.Helper()
	var ee *protocol.EnvelopeError
	if !errors.As(err, &ee) {
		t.Fatalf("error %v (%T) is not an *EnvelopeError", err, err)
	}
	return ee.Reason
}

var want = Expect{Kind: protocol.MsgCall, Reply: "_INBOX__gw.x.web-1", CallID: "c1"}

func TestVerifierRefuses(t *testing.T) {
	f := newFixture(t)
	body := []byte(`{"id":"c1"}`)
	c := f.claims(body)
	auth := f.signer.Sign(c)
	if _, err := f.v.OpenBody(auth, want, body); err != nil {
		t.Fatalf("a genuine call: %v", err)
	}
	if _, err := f.v.OpenBody(auth, want, body); reason(t, err) != protocol.RefusedReplayed {
		t.Errorf("the same call again: %v", err)
	}
	for _, tc := range []struct {
		name   string
		mod    func(*protocol.Claims)
		exp    Expect
		body   []byte
		reason protocol.RefusalReason
	}{
		{"other host", func(c *protocol.Claims) { c.Host = "web-2" }, want, body, protocol.RefusedWrongHost},
		{"other process", func(c *protocol.Claims) { c.Instance = "i-0" }, want, body, protocol.RefusedOtherInstance},
		{"other kind", nil, Expect{Kind: protocol.MsgCancel, Reply: want.Reply, CallID: "c1"}, body, protocol.RefusedMismatch},
		{"other call", nil, Expect{Kind: protocol.MsgCall, Reply: want.Reply, CallID: "c2"}, body, protocol.RefusedMismatch},
		{"other reply", nil, Expect{Kind: protocol.MsgCall, Reply: "_INBOX.rogue", CallID: "c1"}, body, protocol.RefusedMismatch},
		{"tampered", nil, want, []byte(`{"id":"c2"}`), protocol.RefusedTampered},
		{"longer", nil, want, append(body, ' '), protocol.RefusedTampered},
		{"expired", func(c *protocol.Claims) {
			c.IssuedAt, c.Expires = f.now.Add(-time.Hour), f.now.Add(-time.Hour+time.Minute)
		}, want, body, protocol.RefusedExpired},
		{"far future", func(c *protocol.Claims) {
			c.IssuedAt, c.Expires = f.now.Add(time.Hour), f.now.Add(time.Hour+time.Minute)
		}, want, body, protocol.RefusedFuture},
		{"before start", func(c *protocol.Claims) {
			c.IssuedAt, c.Expires = f.now.Add(-protocol.CallClockSkew-time.Second), f.now.Add(5*time.Minute)
		}, want, body, protocol.RefusedBeforeStart},
	} {
		c := f.claims(body)
		if tc.mod != nil {
			tc.mod(c)
		}
		_, err := f.v.OpenBody(f.signer.Sign(c), tc.exp, tc.body)
		if got := reason(t, err); got != tc.reason {
			t.Errorf("%s: %s (%v), want %s", tc.name, got, err, tc.reason)
		}
	}
	// A tampered copy first does not make the genuine message a replay.
	c2 := f.claims(body)
	auth2 := f.signer.Sign(c2)
	if _, err := f.v.OpenBody(auth2, want, []byte(`{"id":"cX"}`)); reason(t, err) != protocol.RefusedTampered {
		t.Fatalf("tampered copy: %v", err)
	}
	if _, err := f.v.OpenBody(auth2, want, body); err != nil {
		t.Errorf("the genuine message after a tampered copy: %v", err)
	}
	// Another key.
	_, other, _ := ed25519.GenerateKey(nil)
	if _, err := f.v.OpenBody(protocol.NewEnvelopeSigner(other).Sign(f.claims(body)), want, body); reason(t, err) != protocol.RefusedUnknownKey {
		t.Errorf("another key: %v", err)
	}
}

// TestReplayAfterRestart: a call recorded for one agent process and
// published again to the next, inside the clock allowance and before the
// envelope expires, is refused: the new process's replay cache never saw
// it, but the envelope names the process it was for.
func TestReplayAfterRestart(t *testing.T) {
	f := newFixture(t)
	body := []byte(`{"id":"c1"}`)
	auth := f.signer.Sign(f.claims(body))
	if _, err := f.v.OpenBody(auth, want, body); err != nil {
		t.Fatalf("a genuine call: %v", err)
	}
	f.now = f.now.Add(20 * time.Second)
	next, err := New(Config{Host: "web-1", Instance: "i-2", Keys: protocol.KeyState{Keys: []string{f.key}}, Started: f.now,
		Now: func() time.Time { return f.now }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.OpenBody(auth, want, body); reason(t, err) != protocol.RefusedOtherInstance {
		t.Errorf("the call replayed to the restarted agent: %v", err)
	}
	if _, err := New(Config{Host: "web-1", Keys: protocol.KeyState{Keys: []string{f.key}}}); err == nil {
		t.Error("a verifier without an instance")
	}
}

func TestVerifierNoKeys(t *testing.T) {
	v, err := New(Config{Host: "web-1", Instance: "i-1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Open("v1.a.b.c", want); reason(t, err) != protocol.RefusedNoKeys {
		t.Errorf("a host without keys: %v", err)
	}
}

// TestReplayCacheBounded: entries go once their envelopes have expired
// (plus the skew allowance); a full cache refuses rather than forgets.
func TestReplayCacheBounded(t *testing.T) {
	f := newFixture(t)
	f.v.replay.max = 3
	body := []byte("x")
	for range 3 {
		if _, err := f.v.OpenBody(f.signer.Sign(f.claims(body)), want, body); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.v.OpenBody(f.signer.Sign(f.claims(body)), want, body); reason(t, err) != protocol.RefusedBusy {
		t.Errorf("a full cache: %v", err)
	}
	f.now = f.now.Add(protocol.EnvelopeLifetime + protocol.CallClockSkew + time.Second)
	if _, err := f.v.OpenBody(f.signer.Sign(f.claims(body)), want, body); err != nil {
		t.Errorf("after the entries expired: %v", err)
	}
	if n := f.v.Len(); n != 1 {
		t.Errorf("the cache holds %d entries, want 1", n)
	}
}

// TestVerifierRotation: keys move on through signed sets; after the
// old key is retired, its envelopes are refused.
func TestVerifierRotation(t *testing.T) {
	f := newFixture(t)
	pub2, priv2, _ := ed25519.GenerateKey(nil)
	key2 := protocol.FormatSigningKey(pub2)
	rotate, _ := protocol.SignKeySet(protocol.KeySet{Serial: 1, Keys: []string{key2, f.key}, At: f.now}, f.priv, priv2)
	retire, _ := protocol.SignKeySet(protocol.KeySet{Serial: 2, Keys: []string{key2}, At: f.now}, priv2)
	body := []byte("x")
	new2 := protocol.NewEnvelopeSigner(priv2)
	if _, err := f.v.OpenBody(new2.Sign(f.claims(body)), want, body); reason(t, err) != protocol.RefusedUnknownKey {
		t.Fatalf("the new key before the rotation: %v", err)
	}
	if changed, err := f.v.Apply(&protocol.KeySetChain{Sets: []protocol.SignedKeySet{rotate}}); !changed || err != nil {
		t.Fatalf("rotation: %v, %v", changed, err)
	}
	for _, s := range []*protocol.EnvelopeSigner{f.signer, new2} {
		if _, err := f.v.OpenBody(s.Sign(f.claims(body)), want, body); err != nil {
			t.Errorf("during the overlap, key %s: %v", s.KeyID(), err)
		}
	}
	if ids := f.v.KeyIDs(); len(ids) != 2 {
		t.Errorf("trusted key ids %v, want two", ids)
	}
	if changed, err := f.v.Apply(&protocol.KeySetChain{Sets: []protocol.SignedKeySet{rotate, retire}}); !changed || err != nil {
		t.Fatalf("retirement: %v, %v", changed, err)
	}
	if _, err := f.v.OpenBody(f.signer.Sign(f.claims(body)), want, body); reason(t, err) != protocol.RefusedUnknownKey {
		t.Errorf("the retired key: %v", err)
	}
	if changed, _ := f.v.Apply(&protocol.KeySetChain{Sets: []protocol.SignedKeySet{rotate, retire}}); changed {
		t.Error("the same chain again changed the keys")
	}
}

// TestReceiptSigner: receipts verify with protocol's own decoding of the
// nkey, against the key nkeys made.
func TestReceiptSigner(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	s, err := NewReceiptSigner(seed)
	if err != nil {
		t.Fatal(err)
	}
	res := &protocol.Result{CallID: "c1", Content: []protocol.Content{protocol.Text("hi")}}
	enc, _ := protocol.EncodeResult(res)
	h, err := s.Sign("web-1", res, enc, time.Now(), time.Now(), nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := protocol.ParseReceipt(h)
	if err == nil {
		err = r.Verify(pub)
	}
	if err == nil {
		err = r.Matches("web-1", "c1", res, enc)
	}
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := protocol.ParseUserKey(pub)
	if !kp2Verify(kp, raw) {
		t.Error("protocol.ParseUserKey does not give the key nkeys signs with")
	}
	if _, err := NewReceiptSigner([]byte("SAxxx")); err == nil {
		t.Error("a bad seed was taken")
	}
}

func kp2Verify(kp nkeys.KeyPair, pub ed25519.PublicKey) bool {
	sig, _ := kp.Sign([]byte("m"))
	return ed25519.Verify(pub, []byte("m"), sig)
}
