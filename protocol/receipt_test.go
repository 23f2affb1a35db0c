package protocol

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base32"
	"strings"
	"testing"
	"time"
)

// userKey encodes pub as an nkey user public key, as nkeys does.
func userKey(pub ed25519.PublicKey) string {
	raw := append([]byte{20 << 3}, pub...)
	crc := crc16(raw)
	raw = append(raw, byte(crc), byte(crc>>8))
	return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(raw)
}

func testReceipt(t *testing.T) (*Receipt, *Result, []byte, ed25519.PrivateKey) {
	t.Helper()
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, ed25519.SeedSize))
	res := &Result{CallID: "c1", IsError: true, Content: []Content{Text("boom\n\nCommand exited with code 2")}}
	enc, err := EncodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	exit := 2
	start := time.Unix(1767225600, 123456789)
	r := NewReceipt("web-1", res, enc, start, start.Add(1500*time.Millisecond), &exit)
	pub, _ := priv.Public().(ed25519.PublicKey)
	if err := r.Sign(userKey(pub), func(b []byte) ([]byte, error) { return ed25519.Sign(priv, b), nil }); err != nil {
		t.Fatal(err)
	}
	return r, res, enc, priv
}

func TestReceiptGolden(t *testing.T) {
	r, _, _, _ := testReceipt(t)
	golden(t, "receipt.golden", []byte(string(r.SigningBytes())+"--- header\n"+r.Header()+"\n"))
}

func TestReceiptRoundTrip(t *testing.T) {
	r, res, enc, _ := testReceipt(t)
	back, err := ParseReceipt(r.Header())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back.SigningBytes(), r.SigningBytes()) || back.Signature != r.Signature || *back.ExitCode != 2 {
		t.Fatalf("parsed %+v, want %+v", back, r)
	}
	if err := back.Verify(r.Key); err != nil {
		t.Fatal(err)
	}
	if err := back.Matches("web-1", "c1", res, enc); err != nil {
		t.Fatal(err)
	}

	other := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{4}, ed25519.SeedSize))
	otherKey := userKey(other.Public().(ed25519.PublicKey))
	if err := back.Verify(otherKey); err == nil || !strings.Contains(err.Error(), "not the host's enrolled key") {
		t.Errorf("a receipt checked against another host's key: %v", err)
	}
	forged := *back
	forged.Key = otherKey
	if err := forged.Verify(otherKey); err == nil {
		t.Error("a receipt whose key was swapped verifies")
	}
	changed := *back
	changed.Outcome = OutcomeOK
	if err := changed.Verify(r.Key); err == nil {
		t.Error("a receipt whose outcome was changed verifies")
	}
	if err := back.Matches("web-2", "c1", res, enc); err == nil {
		t.Error("a receipt of web-1 matches a result of web-2")
	}
	if err := back.Matches("web-1", "c1", res, append(bytes.Clone(enc), 'x')); err == nil {
		t.Error("a receipt matches a result with a byte more")
	}
	if err := back.Matches("web-1", "c1", &Result{CallID: "c1"}, enc); err == nil {
		t.Error("a receipt of a tool error matches a successful result")
	}
	for _, h := range []string{"", "x", "eA.sig", strings.Repeat("a", MaxReceiptHeader+1)} {
		if _, err := ParseReceipt(h); err == nil {
			t.Errorf("ParseReceipt(%.20q) accepted", h)
		}
	}
}

func TestParseUserKey(t *testing.T) {
	pub := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{5}, ed25519.SeedSize)).Public().(ed25519.PublicKey)
	k := userKey(pub)
	got, err := ParseUserKey(k)
	if err != nil || !bytes.Equal(got, pub) {
		t.Fatalf("ParseUserKey = %x, %v", got, err)
	}
	bad := []byte(k)
	bad[10] ^= 1
	for _, s := range []string{"", "U", string(bad), "A" + k[1:]} {
		if _, err := ParseUserKey(s); err == nil {
			t.Errorf("ParseUserKey(%q) accepted", s)
		}
	}
}

func FuzzParseReceipt(f *testing.F) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, ed25519.SeedSize))
	res := &Result{CallID: "c1"}
	enc, _ := EncodeResult(res)
	r := NewReceipt("web-1", res, enc, time.Unix(1, 2), time.Unix(3, 4), nil)
	_ = r.Sign(userKey(priv.Public().(ed25519.PublicKey)), func(b []byte) ([]byte, error) { return ed25519.Sign(priv, b), nil })
	f.Add(r.Header())
	f.Fuzz(func(t *testing.T, h string) {
		r, err := ParseReceipt(h)
		if err != nil {
			return
		}
		b64, _, _ := strings.Cut(h, ".")
		if got := r.Header(); !strings.HasPrefix(got, b64+".") {
			t.Fatalf("parsed a receipt from bytes that are not its canonical form")
		}
	})
}

func BenchmarkReceiptSign(b *testing.B) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, ed25519.SeedSize))
	key := userKey(priv.Public().(ed25519.PublicKey))
	res := &Result{CallID: "c1", Content: []Content{Text("hello")}}
	enc, _ := EncodeResult(res)
	sign := func(m []byte) ([]byte, error) { return ed25519.Sign(priv, m), nil }
	b.ReportAllocs()
	defer reportCPU(b, cpuTime())
	for b.Loop() {
		r := NewReceipt("web-1", res, enc, time.Now(), time.Now(), nil)
		_ = r.Sign(key, sign)
		_ = r.Header()
	}
}

func BenchmarkReceiptVerify(b *testing.B) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, ed25519.SeedSize))
	key := userKey(priv.Public().(ed25519.PublicKey))
	res := &Result{CallID: "c1", Content: []Content{Text("hello")}}
	enc, _ := EncodeResult(res)
	r := NewReceipt("web-1", res, enc, time.Now(), time.Now(), nil)
	_ = r.Sign(key, func(m []byte) ([]byte, error) { return ed25519.Sign(priv, m), nil })
	h := r.Header()
	b.ReportAllocs()
	defer reportCPU(b, cpuTime())
	for b.Loop() {
		back, err := ParseReceipt(h)
		if err == nil {
			err = back.Verify(key)
		}
		if err == nil {
			err = back.Matches("web-1", "c1", res, enc)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}
