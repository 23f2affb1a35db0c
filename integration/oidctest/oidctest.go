// Package oidctest is an OIDC identity provider for tests: an httptest
// server with a discovery document and a JWKS, whose signing keys a test
// adds, publishes and retires while the gateway under test runs, and the
// forged tokens an attacker would try (alg none, algorithm confusion, a
// swapped payload). The gateway's unit tests and the end-to-end tests
// share it.
package oidctest

import (
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
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// JWKSPath is where the issuer serves its key set.
const JWKSPath = "/jwks"

// Issuer is a running identity provider.
type Issuer struct {
	t        testing.TB
	srv      *httptest.Server
	audience string

	mu        sync.Mutex
	keys      map[string]jose.SigningKey
	published []string
	fetches   int
}

// New starts an issuer whose tokens are for audience, with one RS256 key
// kid, published. It stops when t ends.
func New(t testing.TB, audience, kid string) *Issuer {
	is := &Issuer{t: t, audience: audience, keys: map[string]jose.SigningKey{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer":                                is.URL(),
			"jwks_uri":                              is.URL() + JWKSPath,
			"authorization_endpoint":                is.URL() + "/authorize",
			"token_endpoint":                        is.URL() + "/token",
			"id_token_signing_alg_values_supported": []string{"RS256", "ES256", "EdDSA"},
		})
	})
	mux.HandleFunc("GET "+JWKSPath, is.serveKeys)
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	is.AddKey(kid, jose.RS256)
	is.Publish(kid)
	return is
}

// URL is the issuer's URL (its iss).
func (is *Issuer) URL() string { return is.srv.URL }

func (is *Issuer) serveKeys(w http.ResponseWriter, _ *http.Request) {
	is.mu.Lock()
	defer is.mu.Unlock()
	is.fetches++
	var set jose.JSONWebKeySet
	for _, kid := range is.published {
		k := is.keys[kid]
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Key.(crypto.Signer).Public(), KeyID: kid, Algorithm: string(k.Algorithm), Use: "sig"})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(set)
}

// AddKey makes a signing key for alg (RS256, ES256 or EdDSA) under kid,
// not yet published.
func (is *Issuer) AddKey(kid string, alg jose.SignatureAlgorithm) {
	var key crypto.Signer
	var err error
	switch alg {
	case jose.ES256:
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case jose.EdDSA:
		_, key, err = ed25519.GenerateKey(rand.Reader)
	default:
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	}
	if err != nil {
		is.t.Fatal(err)
	}
	is.mu.Lock()
	is.keys[kid] = jose.SigningKey{Algorithm: alg, Key: key}
	is.mu.Unlock()
}

// Publish makes the key set list exactly kids.
func (is *Issuer) Publish(kids ...string) {
	is.mu.Lock()
	is.published = kids
	is.mu.Unlock()
}

// KeyFetches counts the key set's requests so far.
func (is *Issuer) KeyFetches() int {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.fetches
}

// Claims are valid claims for sub, with extra added (or replacing).
func (is *Issuer) Claims(sub string, extra map[string]any) map[string]any {
	now := time.Now()
	c := map[string]any{"iss": is.URL(), "aud": is.audience, "sub": sub, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// Token signs claims with key kid.
func (is *Issuer) Token(kid string, claims map[string]any) string {
	is.mu.Lock()
	k := is.keys[kid]
	is.mu.Unlock()
	return is.sign(jose.SigningKey{Algorithm: k.Algorithm, Key: jose.JSONWebKey{Key: k.Key, KeyID: kid}}, claims)
}

// HMACConfusion signs claims with HS256, the PEM of key kid's public key
// as the secret: a verifier that let the token pick the algorithm would
// accept it.
func (is *Issuer) HMACConfusion(kid string, claims map[string]any) string {
	is.mu.Lock()
	pub := is.keys[kid].Key.(crypto.Signer).Public()
	is.mu.Unlock()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		is.t.Fatal(err)
	}
	secret := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	return is.sign(jose.SigningKey{Algorithm: jose.HS256, Key: jose.JSONWebKey{Key: secret, KeyID: kid}}, claims)
}

func (is *Issuer) sign(key jose.SigningKey, claims map[string]any) string {
	signer, err := jose.NewSigner(key, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		is.t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		is.t.Fatal(err)
	}
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

// AlgNone returns an unsigned (alg none) token of claims.
func AlgNone(claims map[string]any) string {
	h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	p, _ := json.Marshal(claims)
	enc := base64.RawURLEncoding.EncodeToString
	return enc(h) + "." + enc(p) + "."
}

// Tampered swaps a signed token's payload for claims, keeping the
// signature.
func Tampered(token string, claims map[string]any) string {
	parts := strings.Split(token, ".")
	p, _ := json.Marshal(claims)
	parts[1] = base64.RawURLEncoding.EncodeToString(p)
	return strings.Join(parts, ".")
}
