package protocol

import (
	"encoding/base64"
	"strings"
	"testing"
)

const testSeed = "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4"

func testNATSJoinToken() NATSJoinToken {
	_, _, token := NewJoinToken()
	return NATSJoinToken{Token: token, JWT: "eyJhIjoxfQ.eyJiIjoyfQ.c2ln", Seed: testSeed}
}

// A NATS join token goes through Encode and ParseNATSJoinToken whole;
// anything else of its prefix is refused with what is wrong.
func TestNATSJoinToken(t *testing.T) {
	nt := testNATSJoinToken()
	s := nt.Encode()
	if !IsNATSJoinToken(s) || IsNATSJoinToken(nt.Token) {
		t.Fatal("IsNATSJoinToken")
	}
	got, err := ParseNATSJoinToken("  " + s + "\n")
	if err != nil || *got != nt {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	enc := func(js string) string {
		return NATSTokenPrefix + "." + base64.RawURLEncoding.EncodeToString([]byte(js))
	}
	for _, tc := range []struct{ in, want string }{
		{nt.Token, "wrong prefix"},
		{NATSTokenPrefix + ".!!", "not base64url"},
		{enc(`{"token":"x"}`), "not a join token"},
		{enc(`{"token":"` + nt.Token + `","jwt":"a.b.c","seed":"` + testSeed + `","extra":1}`), "not the JSON of one"},
		{enc(`{"token":"` + nt.Token + `","jwt":"a.b.c","seed":"` + testSeed + `"} {}`), "not the JSON of one"},
		{enc(`{"token":"` + nt.Token + `","jwt":"abc","seed":"` + testSeed + `"}`), "not a JWT"},
		{enc(`{"token":"` + nt.Token + `","jwt":"a.b.c","seed":"SAAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4"}`), "not an nkey user seed"},
		{enc(`{"token":"` + nt.Token + `","jwt":"a.b.c","seed":"SU"}`), "not an nkey user seed"},
		{NATSTokenPrefix + "." + strings.Repeat("A", maxNATSToken), "longer than"},
	} {
		if _, err := ParseNATSJoinToken(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.60q: %v; want %q", tc.in, err, tc.want)
		}
	}
}

// The enrol credential's subjects belong to one token: nothing an agent
// may use, no wildcard, no other token's.
func TestEnrolSubjects(t *testing.T) {
	id := "abcdefghij"
	if s := EnrolSubject(id); s != "fleet.v1.enrol.abcdefghij" {
		t.Fatal(s)
	}
	if got, ok := TokenIDOfEnrolSubject(EnrolSubject(id)); !ok || got != id {
		t.Fatal(got, ok)
	}
	for _, s := range []string{"fleet.v1.enrol.*", "fleet.v1.enrol.abc", "fleet.v1.enrol.abcdefghij.x", "fleet.v1.agent.x.renew"} {
		if _, ok := TokenIDOfEnrolSubject(s); ok {
			t.Errorf("%s taken for an enrolment subject", s)
		}
	}
	// An agent's inbox prefix is _INBOX_<host>; a host name has no dot,
	// so no host's inbox covers an enrolment inbox.
	if strings.HasPrefix(EnrolInboxPrefix(id), "_INBOX_") {
		t.Errorf("enrol inbox %s could be a host's", EnrolInboxPrefix(id))
	}
}

func FuzzParseNATSJoinToken(f *testing.F) {
	nt := testNATSJoinToken()
	f.Add(nt.Encode())
	f.Add(NATSTokenPrefix + ".e30")
	f.Add(nt.Token)
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseNATSJoinToken(s)
		if err != nil {
			return
		}
		if _, _, err := ParseJoinToken(got.Token); err != nil {
			t.Fatalf("accepted a NATS token holding a bad join token: %v", err)
		}
		if strings.ContainsAny(got.JWT, " \r\n") || len(got.Seed) != 58 {
			t.Fatalf("accepted %+v", got)
		}
		again, err := ParseNATSJoinToken(got.Encode())
		if err != nil || *again != *got {
			t.Fatalf("re-encoded token does not parse back: %v", err)
		}
	})
}
