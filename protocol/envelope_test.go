package protocol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"
)

// envSeed makes the signatures of these tests reproducible (ed25519 is
// deterministic).
var envSeed = bytes.Repeat([]byte{7}, ed25519.SeedSize)

func testClaims() Claims {
	iat := time.UnixMilli(1767225600123)
	return Claims{
		Kind: MsgCall, Host: "web-1", Instance: "0123456789abcdef", CallID: "c0123456789abcdef", MsgID: "m-1", Tool: "bash",
		Reply: "_INBOX__gw.abc.web-1", BodySHA256: sha256.Sum256([]byte(`{"id":"c1"}`)), BodySize: 11, TimeoutMS: 60000,
		Caller:   CallerClaims{Issuer: "https://id.example", Subject: "alice", ClientID: "cli", Groups: []string{"sre", "ops\nnewline"}},
		IssuedAt: iat, Expires: iat.Add(EnvelopeLifetime),
	}
}

// TestEnvelopeGolden fixes the canonical claims and the signed header: a
// change here is a wire format change every agent must follow.
func TestEnvelopeGolden(t *testing.T) {
	s := NewEnvelopeSigner(ed25519.NewKeyFromSeed(envSeed))
	c := testClaims()
	h := s.Sign(&c)
	var b bytes.Buffer
	b.Write(c.AppendCanonical(nil))
	b.WriteString("--- header\n" + h + "\n")
	golden(t, "envelope.golden", b.Bytes())
}

func trustOnly(priv ed25519.PrivateKey) KeyLookup {
	pub, _ := priv.Public().(ed25519.PublicKey)
	id := KeyID(pub)
	return func(k string) (ed25519.PublicKey, bool) {
		if k == id {
			return pub, true
		}
		return nil, false
	}
}

func TestOpenEnvelope(t *testing.T) {
	priv := ed25519.NewKeyFromSeed(envSeed)
	s := NewEnvelopeSigner(priv)
	c := testClaims()
	h := s.Sign(&c)
	got, err := OpenEnvelope(h, trustOnly(priv))
	if err != nil {
		t.Fatal(err)
	}
	if string(got.AppendCanonical(nil)) != string(c.AppendCanonical(nil)) {
		t.Errorf("opened %+v, want %+v", got, c)
	}

	_, other, _ := ed25519.GenerateKey(nil)
	parts := strings.Split(h, ".")
	claims, _ := base64.RawURLEncoding.DecodeString(parts[2])
	flipped := bytes.Clone(claims)
	flipped[len(envelopeMagic)+8] ^= 1 // a letter of the kind... any byte
	otherHeader := NewEnvelopeSigner(other).Sign(&c)
	// A signature by another key under this key's id.
	forgedSig := strings.Split(otherHeader, ".")[3]
	for _, tc := range []struct {
		name, header string
		reason       RefusalReason
	}{
		{"none", "", RefusedUnsigned},
		{"not v1", "v2." + strings.Join(parts[1:], "."), RefusedMalformed},
		{"too few dots", "v1." + parts[1] + "." + parts[2], RefusedMalformed},
		{"unknown key", otherHeader, RefusedUnknownKey},
		{"changed claims", strings.Join([]string{parts[0], parts[1], base64.RawURLEncoding.EncodeToString(flipped), parts[3]}, "."), RefusedBadSignature},
		{"other key's signature", strings.Join([]string{parts[0], parts[1], parts[2], forgedSig}, "."), RefusedBadSignature},
		{"short signature", strings.Join([]string{parts[0], parts[1], parts[2], parts[3][:20]}, "."), RefusedMalformed},
		{"claims not base64", strings.Join([]string{parts[0], parts[1], "!!", parts[3]}, "."), RefusedMalformed},
		{"huge", "v1." + strings.Repeat("a", MaxAuthHeader), RefusedMalformed},
	} {
		_, err := OpenEnvelope(tc.header, trustOnly(priv))
		ee, ok := err.(*EnvelopeError)
		if !ok || ee.Reason != tc.reason {
			t.Errorf("%s: %v, want a %s refusal", tc.name, err, tc.reason)
		}
	}

	// Claims signed properly but naming another key inside.
	c2 := testClaims()
	c2.KeyID = "elsewhere"
	raw := c2.AppendCanonical(nil)
	sig := ed25519.Sign(priv, raw)
	inner := "v1." + s.KeyID() + "." + base64.RawURLEncoding.EncodeToString(raw) + "." + base64.RawURLEncoding.EncodeToString(sig)
	if _, err := OpenEnvelope(inner, trustOnly(priv)); err == nil || !strings.Contains(err.Error(), "elsewhere") {
		t.Errorf("a key id that differs inside: %v", err)
	}
}

func TestParseClaimsRefuses(t *testing.T) {
	good := testClaims()
	good.KeyID = "k"
	raw := string(good.AppendCanonical(nil))
	sum := fmt.Sprintf("%x", good.BodySHA256)
	for _, tc := range []struct{ name, data, want string }{
		{"no magic", strings.TrimPrefix(raw, envelopeMagic), "do not start"},
		{"trailing", raw + "x", "data after"},
		{"cut", raw[:len(raw)-2], "cut short"},
		{"reordered", strings.Replace(raw, "kind=4:call\nhost=5:web-1\n", "host=5:web-1\nkind=4:call\n", 1), "expected the kind"},
		{"leading zero length", strings.Replace(raw, "kind=4:", "kind=04:", 1), "no length"},
		{"length too long", strings.Replace(raw, "kind=4:", "kind=99999999:", 1), "cut short"},
		{"size not canonical", strings.Replace(raw, "size=2:11", "size=3:011", 1), "not a decimal"},
		{"negative size", strings.Replace(raw, "size=2:11", "size=2:-1", 1), "body of -1"},
		{"bad kind", strings.Replace(raw, "kind=4:call", "kind=4:exec", 1), "not for a call"},
		{"bad host", strings.Replace(raw, "host=5:web-1", "host=5:web.1", 1), "host"},
		{"upper hex", strings.Replace(raw, "body=64:"+sum, "body=64:"+strings.ToUpper(sum), 1), "hex"},
		{"too many groups", strings.Replace(raw, "groups=1:2", "groups=3:999", 1), "groups"},
		{"expires before issued", strings.Replace(raw, "exp=13:1767225660123", "exp=13:1000000000000", 1), "no later"},
	} {
		_, err := ParseClaims([]byte(tc.data))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}

func TestClaimsCheckTime(t *testing.T) {
	started := time.UnixMilli(1767225600000)
	now := started.Add(time.Hour)
	mk := func(iat time.Time, life time.Duration) *Claims {
		return &Claims{IssuedAt: iat, Expires: iat.Add(life)}
	}
	for _, tc := range []struct {
		name   string
		c      *Claims
		reason RefusalReason // "" accepted
	}{
		{"fresh", mk(now, EnvelopeLifetime), ""},
		{"a little in the future", mk(now.Add(CallClockSkew-time.Second), EnvelopeLifetime), ""},
		{"far future", mk(now.Add(CallClockSkew+time.Second), EnvelopeLifetime), RefusedFuture},
		{"expired within skew", mk(now.Add(-EnvelopeLifetime-CallClockSkew+time.Second), EnvelopeLifetime), ""},
		{"expired", mk(now.Add(-EnvelopeLifetime-CallClockSkew-time.Second), EnvelopeLifetime), RefusedExpired},
		{"long-lived", mk(now, MaxEnvelopeLifetime+time.Millisecond), RefusedMalformed},
		{"before start", mk(started.Add(-CallClockSkew-time.Second), MaxEnvelopeLifetime), RefusedBeforeStart},
	} {
		n := now
		if tc.reason == RefusedBeforeStart {
			n = started.Add(time.Second)
		}
		err := tc.c.CheckTime(n, started)
		if tc.reason == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if ee, ok := err.(*EnvelopeError); !ok || ee.Reason != tc.reason {
			t.Errorf("%s: %v, want %s", tc.name, err, tc.reason)
		}
	}
}

func FuzzParseClaims(f *testing.F) {
	c := testClaims()
	c.KeyID = "k"
	f.Add(c.AppendCanonical(nil))
	c.Kind, c.CallID, c.Caller = MsgPoke, "", CallerClaims{}
	f.Add(c.AppendCanonical(nil))
	f.Add([]byte(envelopeMagic + "kind=4:call\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseClaims(data)
		if err != nil {
			return
		}
		if got := c.AppendCanonical(nil); !bytes.Equal(got, data) {
			t.Fatalf("claims parsed from bytes that are not their canonical form:\n%q\n%q", data, got)
		}
	})
}

func FuzzOpenEnvelope(f *testing.F) {
	priv := ed25519.NewKeyFromSeed(envSeed)
	c := testClaims()
	f.Add(NewEnvelopeSigner(priv).Sign(&c))
	f.Add("v1.x.y.z")
	lookup := trustOnly(priv)
	f.Fuzz(func(t *testing.T, h string) {
		c, err := OpenEnvelope(h, lookup)
		if err != nil {
			if _, ok := err.(*EnvelopeError); !ok {
				t.Fatalf("error %T is not an *EnvelopeError", err)
			}
			return
		}
		if c.Validate() != nil {
			t.Fatal("opened claims that do not validate")
		}
	})
}

// The per-message cost of the envelope: the gateway signs, the agent
// opens. Both together must stay under 0.1 ms of CPU.
func BenchmarkEnvelopeSign(b *testing.B) {
	s := NewEnvelopeSigner(ed25519.NewKeyFromSeed(envSeed))
	c := testClaims()
	b.ReportAllocs()
	defer reportCPU(b, cpuTime())
	for b.Loop() {
		c.MsgID = NewMsgID()
		_ = s.Sign(&c)
	}
}

func BenchmarkEnvelopeOpen(b *testing.B) {
	priv := ed25519.NewKeyFromSeed(envSeed)
	c := testClaims()
	h := NewEnvelopeSigner(priv).Sign(&c)
	lookup := trustOnly(priv)
	b.ReportAllocs()
	defer reportCPU(b, cpuTime())
	for b.Loop() {
		if _, err := OpenEnvelope(h, lookup); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnvelopeSignOpen is one message's whole cost: the gateway
// signs, the agent opens.
func BenchmarkEnvelopeSignOpen(b *testing.B) {
	priv := ed25519.NewKeyFromSeed(envSeed)
	s := NewEnvelopeSigner(priv)
	lookup := trustOnly(priv)
	c := testClaims()
	b.ReportAllocs()
	defer reportCPU(b, cpuTime())
	for b.Loop() {
		c.MsgID = NewMsgID()
		if _, err := OpenEnvelope(s.Sign(&c), lookup); err != nil {
			b.Fatal(err)
		}
	}
}
