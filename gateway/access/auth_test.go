package access

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/fleetmcp/fleetmcp/integration/oidctest"
)

func newTestAuthenticator(t *testing.T, cfg AuthConfig) *Authenticator {
	t.Helper()
	cfg.SetDefaults()
	if errs := cfg.Validate(); len(errs) > 0 {
		t.Fatalf("config: %v", errors.Join(errs...))
	}
	a, err := NewAuthenticator(t.Context(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("NewAuthenticator: %v", err)
	}
	return a
}

func TestJWTVerification(t *testing.T) {
	is := oidctest.New(t, "fleet", "rsa-1")
	is.AddKey("ec-1", jose.ES256)
	is.AddKey("ed-1", jose.EdDSA)
	is.AddKey("rogue", jose.RS256) // never published
	is.Publish("rsa-1", "ec-1", "ed-1")
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.URL(), Audience: "fleet"})
	now := time.Now()
	with := func(mod func(c map[string]any)) map[string]any {
		c := is.Claims("ada", nil)
		mod(c)
		return c
	}
	valid := is.Token("rsa-1", is.Claims("ada", nil))
	tests := []struct {
		name  string
		token string
		want  string // substring of the refusal; empty: accepted
	}{
		{"valid RS256", valid, ""},
		{"valid ES256", is.Token("ec-1", is.Claims("ada", nil)), ""},
		{"valid EdDSA", is.Token("ed-1", is.Claims("ada", nil)), ""},
		{"audience in a list", is.Token("rsa-1", with(func(c map[string]any) { c["aud"] = []string{"other", "fleet"} })), ""},
		{"expired within the leeway", is.Token("rsa-1", with(func(c map[string]any) { c["exp"] = now.Add(-20 * time.Second).Unix() })), ""},
		{"not yet valid within the leeway", is.Token("rsa-1", with(func(c map[string]any) { c["nbf"] = now.Add(20 * time.Second).Unix() })), ""},
		{"wrong audience", is.Token("rsa-1", with(func(c map[string]any) { c["aud"] = "billing" })), "audience"},
		{"no audience", is.Token("rsa-1", with(func(c map[string]any) { delete(c, "aud") })), "audience"},
		{"wrong issuer", is.Token("rsa-1", with(func(c map[string]any) { c["iss"] = "https://evil.example" })), "issued by a different provider"},
		{"expired", is.Token("rsa-1", with(func(c map[string]any) { c["exp"] = now.Add(-time.Minute).Unix() })), "expired"},
		{"no exp", is.Token("rsa-1", with(func(c map[string]any) { delete(c, "exp") })), "no exp claim"},
		{"not yet valid", is.Token("rsa-1", with(func(c map[string]any) { c["nbf"] = now.Add(time.Minute).Unix() })), "not valid before"},
		{"issued in the future", is.Token("rsa-1", with(func(c map[string]any) { c["iat"] = now.Add(time.Hour).Unix() })), "issued in the future"},
		{"no subject", is.Token("rsa-1", with(func(c map[string]any) { delete(c, "sub") })), "no sub claim"},
		{"alg none", oidctest.AlgNone(is.Claims("ada", nil)), "malformed jwt"},
		{"unknown key", is.Token("rogue", is.Claims("ada", nil)), "matches none of the issuer's keys"},
		{"tampered payload", oidctest.Tampered(valid, is.Claims("root", nil)), "signature"},
		{"HMAC with the public key", is.HMACConfusion("rsa-1", is.Claims("ada", nil)), "HS256"},
		{"not a JWT", "hello", "malformed jwt"},
		{"unknown API token", APITokenPrefix + "nope", "unknown API token"},
		// Hosts see an API token as sub token:NAME; a host whose agent
		// is a minor version older may match that without the issuer.
		{"sub of an API token", is.Token("rsa-1", is.Claims("token:deploy", nil)), `begins with "token:"`},
		{"sub of an API token, no name", is.Token("rsa-1", is.Claims("token:", nil)), `begins with "token:"`},
		{"sub of the local caller", is.Token("rsa-1", is.Claims("local", nil)), "local caller"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
			ti, err := a.verify(context.Background(), tc.token, r)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				id := ti.Extra[identityKey].(*Identity)
				if id.Subject != "ada" || ti.UserID != id.Qualified() || !strings.Contains(ti.UserID, is.URL()) || ti.Expiration.IsZero() {
					t.Fatalf("accepted as %+v (user %q, exp %v)", id, ti.UserID, ti.Expiration)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want a refusal mentioning %q", tc.want)
			}
			if !errors.Is(err, auth.ErrInvalidToken) {
				t.Errorf("error %v does not wrap auth.ErrInvalidToken (it would be a 500)", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
}

// Only the configured algorithms verify, even with a published key.
func TestJWTAlgorithmList(t *testing.T) {
	is := oidctest.New(t, "fleet", "rsa-1")
	is.AddKey("ec-1", jose.ES256)
	is.Publish("rsa-1", "ec-1")
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.URL(), Audience: "fleet", Algorithms: []string{"RS256"}})
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	if _, err := a.verify(context.Background(), is.Token("rsa-1", is.Claims("ada", nil)), r); err != nil {
		t.Fatalf("RS256: %v", err)
	}
	_, err := a.verify(context.Background(), is.Token("ec-1", is.Claims("ada", nil)), r)
	if err == nil || !strings.Contains(err.Error(), "ES256") {
		t.Fatalf("ES256 with only RS256 configured: %v, want a refusal naming ES256", err)
	}
}

// An explicit JWKS URL works without a discovery document, and a wrong
// one is reported at startup.
func TestJWKSWithoutDiscovery(t *testing.T) {
	is := oidctest.New(t, "fleet", "rsa-1")
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.URL(), Audience: "fleet", JWKSURL: is.URL() + "/jwks"})
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	if _, err := a.verify(context.Background(), is.Token("rsa-1", is.Claims("ada", nil)), r); err != nil {
		t.Fatalf("verify: %v", err)
	}
	for _, tc := range []struct {
		cfg  AuthConfig
		want string
	}{
		{AuthConfig{Issuer: is.URL(), Audience: "fleet", JWKSURL: is.URL() + "/nothing"}, "404"},
		{AuthConfig{Issuer: is.URL(), Audience: "fleet", JWKSURL: is.URL() + "/.well-known/openid-configuration"}, "not a JSON Web Key Set"},
		{AuthConfig{Issuer: is.URL() + "/elsewhere", Audience: "fleet"}, "--jwks_uri"},
	} {
		cfg := tc.cfg
		cfg.SetDefaults()
		_, err := NewAuthenticator(t.Context(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewAuthenticator(%+v) = %v, want an error mentioning %q", tc.cfg, err, tc.want)
		}
	}
}

// Tokens signed by unknown keys cannot make the gateway fetch the key set
// more than once per interval; keys the issuer publishes later are picked
// up without a restart; retired keys stop working once the set is
// fetched again.
func TestKeyRotationAndRefetchLimit(t *testing.T) {
	is := oidctest.New(t, "fleet", "rsa-1")
	const every = 300 * time.Millisecond
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.URL(), Audience: "fleet", KeyRefreshInterval: every})
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	verify := func(token string) error {
		_, err := a.verify(context.Background(), token, r)
		return err
	}
	old := is.Token("rsa-1", is.Claims("ada", nil))
	if err := verify(old); err != nil {
		t.Fatalf("old key: %v", err)
	}
	is.AddKey("rogue", jose.RS256)
	flood := make([]string, 50)
	for i := range flood {
		flood[i] = is.Token("rogue", is.Claims(fmt.Sprint("x", i), nil))
	}
	base, start := is.KeyFetches(), time.Now()
	for _, token := range flood {
		if err := verify(token); err == nil {
			t.Fatal("a token signed by an unpublished key was accepted")
		}
	}
	if n, limit := is.KeyFetches()-base, 1+int(time.Since(start)/every); n > limit {
		t.Fatalf("50 tokens with an unknown key caused %d key-set fetches in %s, want at most %d", n, time.Since(start), limit)
	}

	// Rotation: the issuer publishes a new key and retires the old one.
	is.AddKey("rsa-2", jose.RS256)
	is.Publish("rsa-2")
	time.Sleep(every)
	if err := verify(is.Token("rsa-2", is.Claims("ada", nil))); err != nil {
		t.Fatalf("new key after rotation: %v", err)
	}
	// go-oidc answers the fetching call before it stores the new set, so
	// the old set may still verify for a moment: the retired key must stop
	// working within a short bound, not necessarily at the next call.
	for deadline := time.Now().Add(2 * time.Second); verify(old) == nil; {
		if time.Now().After(deadline) {
			t.Fatal("a token signed by the retired key was still accepted 2s after the key set was fetched again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(every)
	if err := verify(old); err == nil {
		t.Fatal("a token signed by the retired key was accepted")
	}
	if err := verify(is.Token("rsa-2", is.Claims("bob", nil))); err != nil {
		t.Fatalf("new key: %v", err)
	}
}

func TestAuthConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  AuthConfig
		want string
	}{
		{AuthConfig{Issuer: "https://id.example"}, "--jwt_audience is required"},
		{AuthConfig{Audience: "fleet"}, "--jwt_issuer is not"},
		{AuthConfig{JWKSURL: "https://id.example/jwks"}, "--jwt_issuer is not"},
		{AuthConfig{Issuer: "id.example", Audience: "fleet"}, "not an http(s) URL"},
		{AuthConfig{Issuer: "https://id.example", Audience: "fleet", Algorithms: []string{"none"}}, `"none" is never accepted`},
		{AuthConfig{Issuer: "https://id.example", Audience: "fleet", Algorithms: []string{"HS256"}}, "HS256 is never accepted"},
		{AuthConfig{Issuer: "https://id.example", Audience: "fleet", Algorithms: []string{"RS1"}}, `unknown algorithm "RS1"`},
		{AuthConfig{Issuer: "https://id.example", Audience: "fleet", Leeway: time.Hour}, "leeway"},
		{AuthConfig{Issuer: "https://id.example", Audience: "fleet", ResourceURL: "/mcp"}, "--resource_url"},
	}
	for _, tc := range tests {
		cfg := tc.cfg
		cfg.SetDefaults()
		err := errors.Join(cfg.Validate()...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want an error mentioning %q", tc.cfg, err, tc.want)
		}
	}
}

func TestIdentityClaims(t *testing.T) {
	is := oidctest.New(t, "fleet", "rsa-1")
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.URL(), Audience: "fleet"})
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	c := is.Claims("u-1", nil)
	c["email"], c["azp"], c["project_id"], c["scope"], c["groups"] = "Ada@Example.com", "cli", "p-7", "openid fleet", []string{"ops"}
	c["email_verified"] = true
	ti, err := a.verify(context.Background(), is.Token("rsa-1", c), r)
	if err != nil {
		t.Fatal(err)
	}
	id := ti.Extra[identityKey].(*Identity)
	if id.Email != "Ada@Example.com" || id.ClientID != "cli" || id.ProjectID != "p-7" || strings.Join(id.Scopes, " ") != "openid fleet" {
		t.Fatalf("identity = %+v", id)
	}
	if got := id.Caller(); got.Subject != "u-1" || got.Name != "Ada@Example.com" {
		t.Fatalf("Caller() = %+v", got)
	}
	for _, verified := range []any{false, "true", nil} {
		c["email_verified"] = verified
		if verified == nil {
			delete(c, "email_verified") // issuers that omit it: not verified
		}
		ti, _ = a.verify(context.Background(), is.Token("rsa-1", c), r)
		if id := ti.Extra[identityKey].(*Identity); id.Email != "" {
			t.Fatalf("e-mail address kept with email_verified %v: %q", verified, id.Email)
		}
	}
}
