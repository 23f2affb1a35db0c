package agent

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

const testBundle = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func signedDesired(t testing.TB, priv ed25519.PrivateKey, d protocol.DesiredState) []byte {
	t.Helper()
	data, err := json.Marshal(protocol.SignedDesiredState{State: d, Signature: protocol.SignBytes(priv, protocol.PurposeDesired, d.CanonicalBytes())})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestDecodeDesiredReply: the replies of a direct get, read as JetStream
// sends them.
func TestDecodeDesiredReply(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(nil)
	good := signedDesired(t, priv, protocol.DesiredState{Host: "web-1", Revision: 3,
		Skills: map[string]protocol.DesiredSkill{"deploy": {BundleID: testBundle, Rollout: "r-1"}, "old": {Remove: true}}})
	subj := nats.Header{"Nats-Subject": {desiredKeySubject("web-1")}}
	d, err := decodeDesiredReply("web-1", subj, good)
	if err != nil || d.State.Revision != 3 || d.State.Skills["deploy"].BundleID != testBundle {
		t.Fatalf("good record: %+v %v", d, err)
	}
	for _, tc := range []struct {
		name string
		hdr  nats.Header
		data string
		want string // "" for errNoDesired
	}{
		{"no record", nats.Header{"Status": {"404"}, "Description": {"Message Not Found"}}, "", ""},
		{"deleted", nats.Header{"KV-Operation": {"DEL"}}, "", ""},
		{"purged", nats.Header{"KV-Operation": {"PURGE"}}, "", ""},
		{"other status", nats.Header{"Status": {"408"}, "Description": {"Request Timeout"}}, "", "status \"408\""},
		{"another host's key", nats.Header{"Nats-Subject": {desiredKeySubject("web-2")}}, string(good), "not this host's"},
		{"unknown operation", nats.Header{"KV-Operation": {"MERGE"}}, string(good), "unknown KV operation"},
		{"not JSON", nil, "{", "not a signed desired state"},
		{"too large", nil, strings.Repeat(" ", maxDesiredBytes+1), "bytes"},
		{"bad skill name", nil, `{"state":{"host":"web-1","skills":{"../x":{"bundle_id":"` + testBundle + `"}}}}`, "names a skill badly"},
		{"bad bundle", nil, `{"state":{"host":"web-1","skills":{"x":{"bundle_id":"sha256:ABC"}}}}`, "is not a bundle ID"},
		{"remove and bundle", nil, `{"state":{"host":"web-1","skills":{"x":{"bundle_id":"` + testBundle + `","remove":true}}}}`, "both removes"},
	} {
		_, err := decodeDesiredReply("web-1", tc.hdr, []byte(tc.data))
		switch {
		case tc.want == "" && !errors.Is(err, errNoDesired):
			t.Errorf("%s: %v, want no desired state", tc.name, err)
		case tc.want != "" && (err == nil || errors.Is(err, errNoDesired) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestVerifyDesired: signature by a trusted key, own host, revision.
func TestVerifyDesired(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	keys := []string{protocol.FormatSigningKey(pub)}
	state := protocol.DesiredState{Host: "web-1", Revision: 5, At: time.Now(), Skills: map[string]protocol.DesiredSkill{"x": {BundleID: testBundle}}}
	sign := func(priv ed25519.PrivateKey, d protocol.DesiredState) *protocol.SignedDesiredState {
		return &protocol.SignedDesiredState{State: d, Signature: protocol.SignBytes(priv, protocol.PurposeDesired, d.CanonicalBytes())}
	}
	if err := verifyDesired(sign(priv, state), keys, "web-1", 5); err != nil {
		t.Errorf("good record at the same revision: %v", err)
	}
	changed := sign(priv, state)
	changed.State.Skills = map[string]protocol.DesiredSkill{"x": {Remove: true}}
	manifestSig := sign(priv, state)
	manifestSig.Signature = protocol.SignBytes(priv, protocol.PurposeManifest, state.CanonicalBytes())
	for _, tc := range []struct {
		name string
		s    *protocol.SignedDesiredState
		keys []string
		last uint64
		want string
	}{
		{"no keys", sign(priv, state), nil, 0, "no gateway signing key"},
		{"untrusted key", sign(other, state), keys, 0, "not a gateway key this agent trusts"},
		{"changed after signing", changed, keys, 0, "does not verify"},
		{"signed for another purpose", manifestSig, keys, 0, "does not verify"},
		{"older", sign(priv, state), keys, 6, "older than revision 6"},
	} {
		if err := verifyDesired(tc.s, tc.keys, "web-1", tc.last); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if err := verifyDesired(sign(priv, state), keys, "web-2", 0); err == nil || !strings.Contains(err.Error(), "not this one") {
		t.Errorf("another host's record: %v", err)
	}
}

// FuzzDecodeDesiredReply: whatever a reply holds, decoding never panics,
// and a record it accepts has only valid skill names and bundle IDs.
func FuzzDecodeDesiredReply(f *testing.F) {
	_, priv, _ := ed25519.GenerateKey(nil)
	f.Add("", "", "", []byte(signedDesired(f, priv, protocol.DesiredState{Host: "web-1", Revision: 1,
		Skills: map[string]protocol.DesiredSkill{"deploy": {BundleID: testBundle}}})))
	f.Add("404", "", "", []byte(nil))
	f.Add("", "DEL", desiredKeySubject("web-1"), []byte(nil))
	f.Add("", "", "", []byte(`{"state":{"skills":{"x":{"remove":true}}}}`))
	f.Add("", "", "", []byte(`{"state":{"skills":{"":{}}}}`))
	f.Fuzz(func(t *testing.T, status, op, subject string, data []byte) {
		hdr := nats.Header{}
		for k, v := range map[string]string{"Status": status, "KV-Operation": op, "Nats-Subject": subject} {
			if v != "" {
				hdr.Set(k, v)
			}
		}
		d, err := decodeDesiredReply("web-1", hdr, data)
		if err != nil {
			if d != nil {
				t.Fatal("a record with an error")
			}
			return
		}
		for name, s := range d.State.Skills {
			if protocol.ValidateSkillName(name) != nil || (!s.Remove && !validBundleID(s.BundleID)) || (s.Remove && s.BundleID != "") {
				t.Fatalf("accepted %q: %+v", name, s)
			}
		}
	})
}

// TestManagedVersion: only a link of exactly the fleet's form is the
// fleet's.
func TestManagedVersion(t *testing.T) {
	for target, want := range map[string]string{
		".fleet/deploy/0123456789ab":         "0123456789ab",
		".fleet/deploy/0123456789ab/":        "",
		".fleet/deploy/0123456789AB":         "",
		".fleet/deploy/0123456789a":          "",
		".fleet/other/0123456789ab":          "",
		"/abs/.fleet/deploy/0123456789ab":    "",
		"./.fleet/deploy/0123456789ab":       "",
		".fleet/deploy/../x/0123456789ab":    "",
		".fleet/deploy/adopted-1700000000":   "",
		"../skills/.fleet/deploy/0123456789": "",
	} {
		got, ok := managedVersion("deploy", target)
		if got != want && ok || ok != (want != "") {
			t.Errorf("managedVersion(%q) = %q %v, want %q", target, got, ok, want)
		}
	}
}

// FuzzManagedVersion: what managedVersion accepts names a folder in
// .fleet/<name>/ and nothing else.
func FuzzManagedVersion(f *testing.F) {
	f.Add(".fleet/deploy/0123456789ab")
	f.Add(".fleet/deploy/../../../etc")
	f.Fuzz(func(t *testing.T, target string) {
		v, ok := managedVersion("deploy", target)
		if ok && (len(v) != 12 || !isLowerHex(v) || strings.ContainsAny(v, "/.")) {
			t.Fatalf("accepted %q as version %q", target, v)
		}
	})
}
