package integration

import (
	"crypto"
	"crypto/ecdsa"
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

// issuer is an OIDC identity provider for tests: an httptest server with
// a discovery document and a JWKS, and signing keys that a test can add,
// publish and retire while the gateway runs.
type issuer struct {
	t   testing.TB
	srv *httptest.Server

	mu        sync.Mutex
	keys      map[string]jose.SigningKey
	published []string
	fetches   int
}

// audience is the audience the gateway under test expects.
const audience = "https://fleet.test/mcp"

func newIssuer(t testing.TB) *issuer {
	is := &issuer{t: t, keys: map[string]jose.SigningKey{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer":                                is.URL(),
			"jwks_uri":                              is.URL() + "/keys",
			"authorization_endpoint":                is.URL() + "/authorize",
			"token_endpoint":                        is.URL() + "/token",
			"id_token_signing_alg_values_supported": []string{"RS256", "ES256"},
		})
	})
	mux.HandleFunc("GET /keys", is.serveKeys)
	is.srv = httptest.NewServer(mux)
	t.Cleanup(is.srv.Close)
	is.addKey("key-1", jose.RS256)
	is.publish("key-1")
	return is
}

func (is *issuer) URL() string { return is.srv.URL }

func (is *issuer) serveKeys(w http.ResponseWriter, _ *http.Request) {
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

// addKey creates a signing key (RS256 or ES256) under kid, unpublished.
func (is *issuer) addKey(kid string, alg jose.SignatureAlgorithm) {
	var key crypto.Signer
	var err error
	if alg == jose.ES256 {
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	} else {
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	}
	if err != nil {
		is.t.Fatal(err)
	}
	is.mu.Lock()
	is.keys[kid] = jose.SigningKey{Algorithm: alg, Key: key}
	is.mu.Unlock()
}

// publish makes the JWKS list exactly kids.
func (is *issuer) publish(kids ...string) {
	is.mu.Lock()
	is.published = kids
	is.mu.Unlock()
}

// keyFetches counts JWKS requests so far.
func (is *issuer) keyFetches() int {
	is.mu.Lock()
	defer is.mu.Unlock()
	return is.fetches
}

// claims are valid claims for sub plus extra.
func (is *issuer) claims(sub string, extra map[string]any) map[string]any {
	now := time.Now()
	c := map[string]any{"iss": is.URL(), "aud": audience, "sub": sub, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

// token signs claims with key kid.
func (is *issuer) token(kid string, claims map[string]any) string {
	is.mu.Lock()
	k := is.keys[kid]
	is.mu.Unlock()
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: k.Algorithm, Key: jose.JSONWebKey{Key: k.Key, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		is.t.Fatal(err)
	}
	return sign(is.t, signer, claims)
}

func sign(t testing.TB, signer jose.Signer, claims map[string]any) string {
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	jws, err := signer.Sign(payload)
	if err != nil {
		t.Fatal(err)
	}
	s, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// hmacConfusion signs claims with HS256 using the PEM of key kid's public
// key as the secret: a verifier that let the token pick the algorithm
// would accept it.
func (is *issuer) hmacConfusion(kid string, claims map[string]any) string {
	is.mu.Lock()
	pub := is.keys[kid].Key.(crypto.Signer).Public()
	is.mu.Unlock()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		is.t.Fatal(err)
	}
	secret := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: jose.JSONWebKey{Key: secret, KeyID: kid}},
		(&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		is.t.Fatal(err)
	}
	return sign(is.t, signer, claims)
}

// algNone returns an unsigned token.
func algNone(claims map[string]any) string {
	h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT"})
	p, _ := json.Marshal(claims)
	enc := base64.RawURLEncoding.EncodeToString
	return enc(h) + "." + enc(p) + "."
}

// tampered swaps a signed token's payload for claims, keeping the
// signature.
func tampered(token string, claims map[string]any) string {
	parts := strings.Split(token, ".")
	p, _ := json.Marshal(claims)
	parts[1] = base64.RawURLEncoding.EncodeToString(p)
	return strings.Join(parts, ".")
}
