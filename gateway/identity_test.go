package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/integration/oidctest"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// TestCallerNamespaces: an API token, the local caller and identity
// provider callers whose subjects are spelt like them are different
// callers everywhere the gateway tells callers apart: what hosts see
// (issuer and subject), the MCP session's owner, the rate limit's key.
func TestCallerNamespaces(t *testing.T) {
	const idp = "https://login.example.com"
	token := &Identity{Kind: KindAPIToken, Subject: "deploy"}
	local := localIdentity()
	for _, other := range []*Identity{
		{Kind: KindOIDC, Issuer: idp, Subject: "deploy"},
		{Kind: KindOIDC, Issuer: idp, Subject: "token:deploy"},
		{Kind: KindOIDC, Issuer: idp, Subject: "Token:deploy"},
		{Kind: KindOIDC, Issuer: idp, Subject: "local"},
		{Kind: KindOIDC, Issuer: "", Subject: "token:deploy"},
		{Kind: KindOIDC, Issuer: protocol.IssuerAPIToken[:9], Subject: protocol.IssuerAPIToken[9:] + " token:deploy"},
	} {
		for _, own := range []*Identity{token, local} {
			a, b := own.Caller(), other.Caller()
			if a.Issuer == b.Issuer && a.Subject == b.Subject {
				t.Errorf("%s and %+v are the same caller to hosts: %+v", own.Name(), other, a)
			}
			if own.qualified() == other.qualified() || own.tokenInfo().UserID == other.tokenInfo().UserID {
				t.Errorf("%s and %+v share a session owner %q", own.Name(), other, own.qualified())
			}
		}
	}
	if c := token.Caller(); c.Issuer != protocol.IssuerAPIToken || c.Subject != "token:deploy" {
		t.Errorf("API token deploy is %+v to hosts, want iss %s, sub token:deploy (what host policies written for it match)", c, protocol.IssuerAPIToken)
	}
}

// TestProviderCannotSpeakForGatewayCallers: an identity provider's
// token with the subject hosts see for an API token or the local caller
// is refused; spellings that only look like it are not theirs, and are
// accepted as the provider's own callers.
func TestProviderCannotSpeakForGatewayCallers(t *testing.T) {
	is := oidctest.New(t, "fleet", "rsa-1")
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.URL(), Audience: "fleet"})
	r := httptest.NewRequest("POST", "/mcp", nil)
	for _, sub := range []string{"token:deploy", "token:", "token:ops@x", "local"} {
		if _, err := a.verify(context.Background(), is.Token("rsa-1", is.Claims(sub, nil)), r); err == nil {
			t.Errorf("sub %q accepted", sub)
		}
	}
	for _, sub := range []string{"deploy", "Token:deploy", "t\u043eken:deploy", "locals", " token:deploy"} {
		ti, err := a.verify(context.Background(), is.Token("rsa-1", is.Claims(sub, nil)), r)
		if err != nil {
			t.Errorf("sub %q refused: %v", sub, err)
			continue
		}
		c := ti.Extra[identityKey].(*Identity).Caller()
		if c.Issuer != is.URL() || c.Subject != sub {
			t.Errorf("sub %q is %+v to hosts, want the issuer's own", sub, c)
		}
	}
	for _, iss := range []string{protocol.IssuerAPIToken, protocol.IssuerLocal, "fleetmcp:api-token/x", "token"} {
		cfg := AuthConfig{Issuer: iss, Audience: "fleet"}
		cfg.setDefaults()
		if errs := cfg.validate(); len(errs) == 0 || !strings.Contains(errs[0].Error(), "not an http(s) URL") {
			t.Errorf("--jwt_issuer %q: %v, want it refused as not an http(s) URL", iss, errs)
		}
	}
	if err := checkProviderIdentity(protocol.IssuerAPIToken, "deploy"); err == nil {
		t.Error("a verified token whose iss is the API tokens' issuer was accepted")
	}
}

// TestRateBucketPerQualifiedCaller: the rate limit is kept per caller as
// hosts know it, so a provider's user cannot spend an API token's
// calls, nor the token the user's.
func TestRateBucketPerQualifiedCaller(t *testing.T) {
	var rl rateLimiters
	lim := RateLimit{1, time.Minute}
	now := time.Unix(1_000_000, 0)
	token := &Identity{Kind: KindAPIToken, Subject: "deploy"}
	user := &Identity{Kind: KindOIDC, Issuer: "https://login.example.com", Subject: "token:deploy"}
	if ok, _ := rl.allow(user.qualified(), lim, now); !ok {
		t.Fatal("the user's first call refused")
	}
	if ok, _ := rl.allow(token.qualified(), lim, now); !ok {
		t.Fatal("the API token's first call refused: it shares the user's bucket")
	}
}

// TestAuditLineNamesTokens: the audit text tells an API token from a
// provider's user of the same name.
func TestAuditLineNamesTokens(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tok := audit.Record{Time: at, Caller: audit.Caller{Kind: string(KindAPIToken), Subject: "deploy"}, Tool: "read"}
	usr := audit.Record{Time: at, Caller: audit.Caller{Kind: string(KindOIDC), Subject: "deploy"}, Tool: "read"}
	a, b := strings.Split(tok.Line(), "\t")[1], strings.Split(usr.Line(), "\t")[1]
	if a != "token deploy" || b != "deploy" {
		t.Errorf("callers shown as %q and %q, want \"token deploy\" and \"deploy\"", a, b)
	}
}

// TestAccessRulesByIssuer: deny rules that say the issuer refuse the
// caller they name and no other caller with the same subject.
func TestAccessRulesByIssuer(t *testing.T) {
	data, err := os.ReadFile("testdata/access/issuers.txtar")
	if err != nil {
		t.Fatal(err)
	}
	_, files := parseTxtar(data)
	a, err := ParseAccess("access.yaml", files[0].data)
	if err != nil {
		t.Fatal(err)
	}
	const idp = "https://login.example.com"
	secret := apiTokenPrefix + strings.Repeat("a", 43)
	sum := sha256.Sum256([]byte(secret))
	tokens, err := ParseAPITokens("tokens.yaml", []byte("tokens:\n  - {name: deploy, sha256: \""+hex.EncodeToString(sum[:])+"\", hosts: [\"*\"], tools: [read, bash]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	token := &Identity{Kind: KindAPIToken, Subject: "deploy", token: tokens.lookup(secret)}
	user := &Identity{Kind: KindOIDC, Issuer: idp, Subject: "deploy"}
	other := &Identity{Kind: KindOIDC, Issuer: idp, Subject: "token:deploy"}
	for _, tc := range []struct {
		id         *Identity
		tool       string
		allowed    bool
		rule, name string
	}{
		{token, "read", true, "token deploy", "the token reads"},
		{token, "bash", false, "no-bash-for-token-deploy", "the token's bash is refused"},
		{user, "read", false, "no-reads-for-user-deploy", "the user's reads are refused"},
		{user, "bash", true, "idp-users", "the user runs bash"},
		{other, "read", true, "idp-users", "a user named like the token reads"},
		{other, "bash", true, "idp-users", "a user named like the token is not refused the token's bash"},
	} {
		d := a.For(tc.id).Tool(tc.tool, "web-1", nil)
		if d.Allowed != tc.allowed || d.Rule != tc.rule {
			t.Errorf("%s: %+v, want allowed=%v by %s", tc.name, d, tc.allowed, tc.rule)
		}
	}
}
