package gateway

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/auth"
)

// testIssuer is an OIDC issuer for unit tests: discovery document, JWKS
// and signing keys. Which keys it publishes can change while it runs.
type testIssuer struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	keys      map[string]jose.SigningKey
	published []string
	fetches   int
}

func newTestIssuer(t *testing.T) *testIssuer {
	is := &testIssuer{t: t, keys: map[string]jose.SigningKey{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer": is.srv.URL, "jwks_uri": is.srv.URL + "/jwks",
			"id_token_signing_alg_values_supported": []string{"RS256", "ES256", "EdDSA"},
		})
	})
	mux.HandleFunc("/jwks", is.serveJWKS)
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	is.addKey("rsa-1", jose.RS256)
	is.publish("rsa-1")
	return is
}

func (is *testIssuer) serveJWKS(w http.ResponseWriter, _ *http.Request) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.fetches++
	var set jose.JSONWebKeySet
	for _, kid := range is.published {
		k := is.keys[kid]
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Key.(crypto.Signer).Public(), KeyID: kid, Algorithm: string(k.Algorithm), Use: "sig"})
	}
	_ = json.NewEncoder(w).Encode(set)
}

// addKey makes a signing key for alg under kid (not yet published).
func (is *testIssuer) addKey(kid string, alg jose.SignatureAlgorithm) {
	var key crypto.Signer
	var err error
	switch alg {
	case jose.RS256:
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	case jose.ES256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jose.EdDSA:
		_, key, err = ed25519.GenerateKey(rand.Reader)
	}
	if err != nil {
		is.t.Fatal(err)
	}
	is.mu.Lock()
	is.keys[kid] = jose.SigningKey{Algorithm: alg, Key: key}
	is.mu.Unlock()
}

// publish sets the keys the JWKS lists.
func (is *testIssuer) publish(kids ...string) {
	is.mu.Lock()
	is.published = kids
	is.mu.Unlock()
}

func (is *testIssuer) jwksFetches() int {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.fetches
}

// claims returns valid claims for sub, to be adjusted by a test.
func (is *testIssuer) claims(sub string) map[string]any {
	now := time.Now()
	return map[string]any{
		"iss": is.srv.URL, "aud": "fleet", "sub": sub,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	}
}

// sign signs claims with the key kid.
func (is *testIssuer) sign(kid string, claims map[string]any) string {
	is.mu.Lock()
	k := is.keys[kid]
	is.mu.Unlock()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: k.Algorithm, Key: jose.JSONWebKey{Key: k.Key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		is.t.Fatal(err)
	}
	payload, _ := json.Marshal(claims)
	jws, err := signer.Sign(payload)
	if err != nil {
		is.t.Fatal(err)
	}
	s, err := jws.CompactSerialize()
	if err != nil {
		is.t.Fatal(err)
	}
	return s
}

// unsigned returns an alg:none token.
func unsigned(claims map[string]any) string {
	h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	p, _ := json.Marshal(claims)
	enc := base64.RawURLEncoding.EncodeToString
	return enc(h) + "." + enc(p) + "."
}

// hmacWithPublicKey signs claims with HS256, using the PEM of the RSA key
// kid's public key as the HMAC secret: the algorithm-confusion attack.
func (is *testIssuer) hmacWithPublicKey(kid string, claims map[string]any) string {
	is.mu.Lock()
	pub := is.keys[kid].Key.(crypto.Signer).Public()
	is.mu.Unlock()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		is.t.Fatal(err)
	}
	secret := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: jose.JSONWebKey{Key: secret, KeyID: kid}}, nil)
	if err != nil {
		is.t.Fatal(err)
	}
	payload, _ := json.Marshal(claims)
	jws, _ := signer.Sign(payload)
	s, _ := jws.CompactSerialize()
	return s
}

// tamper replaces the payload of a signed token, keeping its signature.
func tamper(token string, claims map[string]any) string {
	parts := strings.Split(token, ".")
	p, _ := json.Marshal(claims)
	parts[1] = base64.RawURLEncoding.EncodeToString(p)
	return strings.Join(parts, ".")
}

func newTestAuthenticator(t *testing.T, cfg AuthConfig) *authenticator {
	t.Helper()
	cfg.setDefaults()
	if errs := cfg.validate(); len(errs) > 0 {
		t.Fatalf("config: %v", errors.Join(errs...))
	}
	a, err := newAuthenticator(t.Context(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("newAuthenticator: %v", err)
	}
	return a
}

func TestJWTVerification(t *testing.T) {
	is := newTestIssuer(t)
	is.addKey("ec-1", jose.ES256)
	is.addKey("ed-1", jose.EdDSA)
	is.addKey("rogue", jose.RS256) // never published
	is.publish("rsa-1", "ec-1", "ed-1")
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.srv.URL, Audience: "fleet"})
	now := time.Now()
	with := func(mod func(c map[string]any)) map[string]any {
		c := is.claims("ada")
		mod(c)
		return c
	}
	valid := is.sign("rsa-1", is.claims("ada"))
	tests := []struct {
		name  string
		token string
		want  string // substring of the refusal; empty: accepted
	}{
		{"valid RS256", valid, ""},
		{"valid ES256", is.sign("ec-1", is.claims("ada")), ""},
		{"valid EdDSA", is.sign("ed-1", is.claims("ada")), ""},
		{"audience in a list", is.sign("rsa-1", with(func(c map[string]any) { c["aud"] = []string{"other", "fleet"} })), ""},
		{"expired within the leeway", is.sign("rsa-1", with(func(c map[string]any) { c["exp"] = now.Add(-20 * time.Second).Unix() })), ""},
		{"not yet valid within the leeway", is.sign("rsa-1", with(func(c map[string]any) { c["nbf"] = now.Add(20 * time.Second).Unix() })), ""},
		{"wrong audience", is.sign("rsa-1", with(func(c map[string]any) { c["aud"] = "billing" })), "audience"},
		{"no audience", is.sign("rsa-1", with(func(c map[string]any) { delete(c, "aud") })), "audience"},
		{"wrong issuer", is.sign("rsa-1", with(func(c map[string]any) { c["iss"] = "https://evil.example" })), "issued by a different provider"},
		{"expired", is.sign("rsa-1", with(func(c map[string]any) { c["exp"] = now.Add(-time.Minute).Unix() })), "expired"},
		{"no exp", is.sign("rsa-1", with(func(c map[string]any) { delete(c, "exp") })), "no exp claim"},
		{"not yet valid", is.sign("rsa-1", with(func(c map[string]any) { c["nbf"] = now.Add(time.Minute).Unix() })), "not valid before"},
		{"issued in the future", is.sign("rsa-1", with(func(c map[string]any) { c["iat"] = now.Add(time.Hour).Unix() })), "issued in the future"},
		{"no subject", is.sign("rsa-1", with(func(c map[string]any) { delete(c, "sub") })), "no sub claim"},
		{"alg none", unsigned(is.claims("ada")), "malformed jwt"},
		{"unknown key", is.sign("rogue", is.claims("ada")), "matches none of the issuer's keys"},
		{"tampered payload", tamper(valid, is.claims("root")), "signature"},
		{"HMAC with the public key", is.hmacWithPublicKey("rsa-1", is.claims("ada")), "HS256"},
		{"not a JWT", "hello", "malformed jwt"},
		{"unknown API token", apiTokenPrefix + "nope", "unknown API token"},
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
				if id.Subject != "ada" || ti.UserID != "ada" || ti.Expiration.IsZero() {
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
	is := newTestIssuer(t)
	is.addKey("ec-1", jose.ES256)
	is.publish("rsa-1", "ec-1")
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.srv.URL, Audience: "fleet", Algorithms: []string{"RS256"}})
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	if _, err := a.verify(context.Background(), is.sign("rsa-1", is.claims("ada")), r); err != nil {
		t.Fatalf("RS256: %v", err)
	}
	_, err := a.verify(context.Background(), is.sign("ec-1", is.claims("ada")), r)
	if err == nil || !strings.Contains(err.Error(), "ES256") {
		t.Fatalf("ES256 with only RS256 configured: %v, want a refusal naming ES256", err)
	}
}

// An explicit JWKS URL works without a discovery document, and a wrong
// one is reported at startup.
func TestJWKSWithoutDiscovery(t *testing.T) {
	is := newTestIssuer(t)
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.srv.URL, Audience: "fleet", JWKSURL: is.srv.URL + "/jwks"})
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	if _, err := a.verify(context.Background(), is.sign("rsa-1", is.claims("ada")), r); err != nil {
		t.Fatalf("verify: %v", err)
	}
	for _, tc := range []struct {
		cfg  AuthConfig
		want string
	}{
		{AuthConfig{Issuer: is.srv.URL, Audience: "fleet", JWKSURL: is.srv.URL + "/nothing"}, "404"},
		{AuthConfig{Issuer: is.srv.URL, Audience: "fleet", JWKSURL: is.srv.URL + "/.well-known/openid-configuration"}, "not a JSON Web Key Set"},
		{AuthConfig{Issuer: is.srv.URL + "/elsewhere", Audience: "fleet"}, "--jwks_uri"},
	} {
		cfg := tc.cfg
		cfg.setDefaults()
		_, err := newAuthenticator(t.Context(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("newAuthenticator(%+v) = %v, want an error mentioning %q", tc.cfg, err, tc.want)
		}
	}
}

// Tokens signed by unknown keys cannot make the gateway fetch the key set
// more than once per interval; keys the issuer publishes later are picked
// up without a restart; retired keys stop working once the set is
// fetched again.
func TestKeyRotationAndRefetchLimit(t *testing.T) {
	is := newTestIssuer(t)
	const every = 300 * time.Millisecond
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.srv.URL, Audience: "fleet", KeyRefreshInterval: every})
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	verify := func(token string) error {
		_, err := a.verify(context.Background(), token, r)
		return err
	}
	old := is.sign("rsa-1", is.claims("ada"))
	if err := verify(old); err != nil {
		t.Fatalf("old key: %v", err)
	}
	is.addKey("rogue", jose.RS256)
	flood := make([]string, 50)
	for i := range flood {
		flood[i] = is.sign("rogue", is.claims(fmt.Sprint("x", i)))
	}
	base, start := is.jwksFetches(), time.Now()
	for _, token := range flood {
		if err := verify(token); err == nil {
			t.Fatal("a token signed by an unpublished key was accepted")
		}
	}
	if n, limit := is.jwksFetches()-base, 1+int(time.Since(start)/every); n > limit {
		t.Fatalf("50 tokens with an unknown key caused %d key-set fetches in %s, want at most %d", n, time.Since(start), limit)
	}

	// Rotation: the issuer publishes a new key and retires the old one.
	is.addKey("rsa-2", jose.RS256)
	is.publish("rsa-2")
	time.Sleep(every)
	if err := verify(is.sign("rsa-2", is.claims("ada"))); err != nil {
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
	if err := verify(is.sign("rsa-2", is.claims("bob"))); err != nil {
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
		cfg.setDefaults()
		err := errors.Join(cfg.validate()...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("validate(%+v) = %v, want an error mentioning %q", tc.cfg, err, tc.want)
		}
	}
}

func TestIdentityClaims(t *testing.T) {
	is := newTestIssuer(t)
	a := newTestAuthenticator(t, AuthConfig{Issuer: is.srv.URL, Audience: "fleet"})
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	c := is.claims("u-1")
	c["email"], c["azp"], c["project_id"], c["scope"], c["groups"] = "Ada@Example.com", "cli", "p-7", "openid fleet", []string{"ops"}
	c["email_verified"] = true
	ti, err := a.verify(context.Background(), is.sign("rsa-1", c), r)
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
		ti, _ = a.verify(context.Background(), is.sign("rsa-1", c), r)
		if id := ti.Extra[identityKey].(*Identity); id.Email != "" {
			t.Fatalf("e-mail address kept with email_verified %v: %q", verified, id.Email)
		}
	}
}
