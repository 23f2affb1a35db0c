package protocol

import (
	"crypto/x509"
	"encoding/pem"
	"slices"
	"strings"
	"testing"
)

// The agent permissions, as the signing key's template and for one host:
// exactly these subjects, so that the template, the docs
// (deploy/nats/README.md) and the tests agree.
func TestAgentPermissions(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want []string
	}{
		{"publish template", AgentPublishTemplate(), []string{"fleet.v1.presence.{{name()}}", "fleet.v1.agent.{{name()}}.>"}},
		{"subscribe template", AgentSubscribeTemplate(), []string{"fleet.v1.host.{{name()}}.>", "fleet.v1.discover", "_INBOX_{{name()}}.>"}},
		{"publish web-1", AgentPublishAllow("web-1"), []string{"fleet.v1.presence.web-1", "fleet.v1.agent.web-1.>"}},
		{"subscribe web-1", AgentSubscribeAllow("web-1"), []string{"fleet.v1.host.web-1.>", "fleet.v1.discover", "_INBOX_web-1.>"}},
	} {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	// The template applied to a host (as the server does) is the host's
	// permissions; the server inserts the JWT's name, which ValidateHost
	// keeps free of '.', '*' and '>'.
	for i, s := range AgentSubscribeTemplate() {
		if got := strings.ReplaceAll(s, NameTemplate, "web-1"); got != AgentSubscribeAllow("web-1")[i] {
			t.Errorf("template %s gives %s for web-1, want %s", s, got, AgentSubscribeAllow("web-1")[i])
		}
	}
	for _, s := range append(AgentPublishAllow("web-1"), AgentSubscribeAllow("web-1")...) {
		if strings.Contains(s, "web-2") || strings.Count(s, "web-1") != 1 && s != DiscoverSubject() {
			t.Errorf("%s is not web-1's alone", s)
		}
	}
}

// The CA pin is the SHA-256 of the CA's public key (SubjectPublicKeyInfo):
// this certificate's pin is known (`openssl x509 -pubkey -noout | openssl
// pkey -pubin -outform der | sha256sum`).
func TestCAPin(t *testing.T) {
	block, _ := pem.Decode([]byte(testCA))
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	const want = "sha256:" + testCAPinHex
	if got := CAPin(cert); got != want {
		t.Errorf("CAPin = %s, want %s", got, want)
	}
	for pin, ok := range map[string]bool{
		want: true, "sha256:" + strings.ToUpper(testCAPinHex): false, testCAPinHex: false, "sha256:" + testCAPinHex[2:]: false,
		"sha1:" + testCAPinHex: false, "sha256:" + strings.Repeat("g", 64): false, "": false,
	} {
		if ValidCAPin(pin) != ok {
			t.Errorf("ValidCAPin(%q) = %v, want %v", pin, !ok, ok)
		}
	}
}

const testCA = `-----BEGIN CERTIFICATE-----
MIIBfjCCASWgAwIBAgIUSp2NHZ4DIbzhNqwx/5990AsWQywwCgYIKoZIzj0EAwIw
FTETMBEGA1UEAwwKZmxlZXQgdGVzdDAeFw0yNjEyMDExNjU3MTRaFw0zNjExMjgx
NjU3MTRaMBUxEzARBgNVBAMMCmZsZWV0IHRlc3QwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAATN84ira/XRdtlDJoobNzELzQPVzwdAlsHeAX83PI7QWFuj1YLBNRls
rhyEJui/OoGGu6yxEVmMx/vubs+V5Jx+o1MwUTAdBgNVHQ4EFgQUHx++yzmT+sBi
WiOyCSMp/9sTq4IwHwYDVR0jBBgwFoAUHx++yzmT+sBiWiOyCSMp/9sTq4IwDwYD
VR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiAgDf38p1yFxwJJ89LwxfMQ
yQogPUSqzU2d3M0wi7NUzwIgDSK71Uw+JdWarl43L8oU4batj//2bPg/zniVGW1x
faE=
-----END CERTIFICATE-----
`

const testCAPinHex = "082521e1d4eb7721f8ede5079dc5b1005ee19a79a64c458b938c05cf35737942"

// FuzzValidCAPin: a pin ValidCAPin accepts is sha256: and 64 lowercase
// hex digits, nothing else.
func FuzzValidCAPin(f *testing.F) {
	for _, s := range []string{"sha256:" + testCAPinHex, "sha256:", "sha256:" + strings.ToUpper(testCAPinHex), "", "sha256:zz"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pin string) {
		if !ValidCAPin(pin) {
			return
		}
		h, ok := strings.CutPrefix(pin, CAPinPrefix)
		if !ok || len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
			t.Fatalf("ValidCAPin accepted %q", pin)
		}
	})
}

// IsAgentReply accepts subjects under the host's own inbox only.
func TestIsAgentReply(t *testing.T) {
	for _, tc := range []struct {
		host, reply string
		want        bool
	}{
		{"web-1", "_INBOX_web-1.abc", true},
		{"web-1", "_INBOX_web-1.abc.7", true},
		{"web-1", "", false},
		{"web-1", "_INBOX_web-1", false},
		{"web-1", "_INBOX_web-1.", false},
		{"web-1", "_INBOX_web-1..x", false},
		{"web-1", "_INBOX_web-1.*", false},
		{"web-1", "_INBOX_web-1.a.>", false},
		{"web-1", "_INBOX_web-10.abc", false},
		{"web-1", "_INBOX_web-2.abc", false},
		{"web-1", "fleet.v1.host.web-2.call", false},
		{"web-1", "$KV.fleet_skills.web-2", false},
		{"web-1", "$JS.API.STREAM.PURGE.KV_fleet_agents", false},
		{"web-1", "x._INBOX_web-1.abc", false},
		{"web-1", "_INBOX_web-1.a b", false},
	} {
		if got := IsAgentReply(tc.host, tc.reply); got != tc.want {
			t.Errorf("IsAgentReply(%q, %q) = %v, want %v", tc.host, tc.reply, got, tc.want)
		}
	}
}
