package protocol

import (
	"strings"
	"testing"
	"time"
)

// TestSigningBytesGolden fixes the encoding the agent signs: a change to
// it breaks every agent already deployed.
func TestSigningBytesGolden(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 5, time.FixedZone("x", 3600))
	p := Proof{PublicKey: "UKEY", Nonce: "bm9uY2U", Time: at, Signature: "ignored"}
	enrol := &EnrolRequest{Token: "fmcp1.abc.def", Host: "web-1", CAPin: "sha256:00", Facts: AgentFacts{OS: "linux", Arch: "amd64"}, Proof: p}
	want := "fleetmcp-v1 enrol\npublic_key=4:UKEY\nnonce=7:bm9uY2U\ntime=30:2026-12-01T09:00:00.000000005Z\n" +
		"token=13:fmcp1.abc.def\nhost=5:web-1\nca_pin=9:sha256:00\nos=5:linux\narch=5:amd64\nhostname=0:\nkernel=0:\n"
	if got := string(enrol.SigningBytes()); got != want {
		t.Errorf("enrol signing bytes:\n%q\nwant\n%q", got, want)
	}
	renew := &RenewRequest{Host: "web-1", Proof: p}
	want = "fleetmcp-v1 renew\npublic_key=4:UKEY\nnonce=7:bm9uY2U\ntime=30:2026-12-01T09:00:00.000000005Z\nhost=5:web-1\n"
	if got := string(renew.SigningBytes()); got != want {
		t.Errorf("renew signing bytes:\n%q\nwant\n%q", got, want)
	}
	rec := &RecoverRequest{Host: "web-1", CAPin: "sha256:00", Proof: p}
	if got := string(rec.SigningBytes()); !strings.HasPrefix(got, "fleetmcp-v1 recover\n") {
		t.Errorf("recover signing bytes start %q", got)
	}
	loc := &LocateRequest{Host: "web-1", CAPin: "sha256:00", Proof: p}
	want = "fleetmcp-v1 locate\npublic_key=4:UKEY\nnonce=7:bm9uY2U\ntime=30:2026-12-01T09:00:00.000000005Z\nhost=5:web-1\nca_pin=9:sha256:00\n"
	if got := string(loc.SigningBytes()); got != want {
		t.Errorf("locate signing bytes:\n%q\nwant\n%q", got, want)
	}
}

// TestSigningBytesDistinct: requests that differ in any field, or only
// in where a value ends, sign differently.
func TestSigningBytesDistinct(t *testing.T) {
	base := EnrolRequest{Token: "t", Host: "h", CAPin: "c", Proof: Proof{PublicKey: "U", Nonce: "n", Time: time.Unix(1, 0)}}
	variants := []func(r *EnrolRequest){
		func(r *EnrolRequest) { r.Token = "t2" },
		func(r *EnrolRequest) { r.Host = "h2" },
		func(r *EnrolRequest) { r.CAPin = "c2" },
		func(r *EnrolRequest) { r.PublicKey = "U2" },
		func(r *EnrolRequest) { r.Nonce = "n2" },
		func(r *EnrolRequest) { r.Time = r.Time.Add(time.Nanosecond) },
		func(r *EnrolRequest) { r.Facts.Kernel = "k" },
		// A value that spills into the next field's place.
		func(r *EnrolRequest) { r.Token, r.Host = "t\nhost=1:h", "" },
	}
	seen := map[string]int{string(base.SigningBytes()): -1}
	for i, change := range variants {
		r := base
		change(&r)
		b := string(r.SigningBytes())
		if j, dup := seen[b]; dup {
			t.Errorf("variant %d signs like %d", i, j)
		}
		seen[b] = i
	}
	if string((&RenewRequest{Host: "h", Proof: base.Proof}).SigningBytes()) == string((&RecoverRequest{Host: "h", Proof: base.Proof}).SigningBytes()) {
		t.Error("a renewal and a recovery sign alike")
	}
	if string((&LocateRequest{Host: "h", CAPin: "c", Proof: base.Proof}).SigningBytes()) == string((&RecoverRequest{Host: "h", CAPin: "c", Proof: base.Proof}).SigningBytes()) {
		t.Error("a request for the NATS URLs and a recovery sign alike")
	}
}

func TestJoinToken(t *testing.T) {
	id, secret, token := NewJoinToken()
	gotID, gotSecret, err := ParseJoinToken(" " + token + "\n")
	if err != nil || gotID != id || string(gotSecret) != string(secret) {
		t.Fatalf("ParseJoinToken(%q) = %q, %x, %v; want %q, %x", token, gotID, gotSecret, err, id, secret)
	}
	_, _, other := NewJoinToken()
	if other == token {
		t.Error("two tokens alike")
	}
	for _, bad := range []string{"", token + ".x", "fmcp2" + token[5:], strings.ToUpper(token[:16]) + token[16:],
		TokenPrefix + ".abcdefghi1." + token[17:], TokenPrefix + "." + id + ".short", TokenPrefix + "." + id + "." + token[17:] + "AA"} {
		if _, _, err := ParseJoinToken(bad); err == nil || !strings.Contains(err.Error(), "fleetctl token create") {
			t.Errorf("ParseJoinToken(%q) = %v, want an error saying where tokens come from", bad, err)
		}
	}
}

func TestCheckTime(t *testing.T) {
	now := time.Now()
	for _, d := range []time.Duration{0, MaxClockSkew, -MaxClockSkew} {
		if err := (&Proof{Time: now.Add(d)}).CheckTime(now); err != nil {
			t.Errorf("skew %s: %v", d, err)
		}
	}
	for _, d := range []time.Duration{MaxClockSkew + time.Second, -MaxClockSkew - time.Second} {
		if err := (&Proof{Time: now.Add(d)}).CheckTime(now); err == nil || !strings.Contains(err.Error(), "clock") {
			t.Errorf("skew %s: %v, want a clock error", d, err)
		}
	}
}

func TestNonce(t *testing.T) {
	if err := CheckNonce(NewNonce()); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "AAAA", NewNonce() + "AA", "!!!!!!!!!!!!!!!!!!!!!!"} {
		if CheckNonce(bad) == nil {
			t.Errorf("CheckNonce(%q) passed", bad)
		}
	}
}

func FuzzParseJoinToken(f *testing.F) {
	_, _, token := NewJoinToken()
	f.Add(token)
	f.Add("fmcp1.aaaaaaaaaa.")
	f.Add("fmcp1..")
	f.Fuzz(func(t *testing.T, s string) {
		id, secret, err := ParseJoinToken(s)
		if err != nil {
			return
		}
		if CheckTokenID(id) != nil || len(secret) != TokenSecretBytes {
			t.Fatalf("ParseJoinToken(%q) accepted id %q, %d secret bytes", s, id, len(secret))
		}
	})
}
