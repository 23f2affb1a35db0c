package access

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/modelcontextprotocol/go-sdk/auth"
)

// This file verifies bearer JWTs with go-oidc: signature against the
// issuer's published keys (found by discovery, or at an explicit JWKS
// URL), issuer, audience and algorithm. go-oidc has no clock leeway, so
// expiry and not-before are checked here instead. It also refetches the
// key set for every unknown key ID; limitedKeySet bounds that.

// DefaultAlgorithms are the JWT signature algorithms accepted unless
// AuthConfig.Algorithms says otherwise: asymmetric ones only.
func DefaultAlgorithms() []string {
	return []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
}

// checkAlgorithm refuses algorithms that must never verify a caller's
// token.
func checkAlgorithm(alg string) error {
	switch {
	case strings.EqualFold(alg, "none"):
		return errors.New(`"none" is never accepted: an unsigned token proves nothing`)
	case strings.HasPrefix(strings.ToUpper(alg), "HS"):
		return fmt.Errorf("%s is never accepted: HMAC needs a secret shared with the issuer, and a public key must not be usable as one", alg)
	}
	for _, a := range DefaultAlgorithms() {
		if a == alg {
			return nil
		}
	}
	return fmt.Errorf("unknown algorithm %q: use some of %s", alg, strings.Join(DefaultAlgorithms(), ", "))
}

// jwtVerifier checks bearer JWTs from one issuer for one audience.
type jwtVerifier struct {
	verifier *oidc.IDTokenVerifier
	leeway   time.Duration
	now      func() time.Time
	// groups is the claim that lists the caller's groups.
	groups string
}

// newJWTVerifier finds the issuer's keys (discovery unless cfg.JWKSURL is
// set), checks that they can be fetched, and returns a verifier. It fails
// with a message that says what to configure.
func newJWTVerifier(ctx context.Context, cfg *AuthConfig) (*jwtVerifier, error) {
	client := cfg.HTTPClient
	jwksURL := cfg.JWKSURL
	if jwksURL == "" {
		p, err := oidc.NewProvider(oidc.ClientContext(ctx, client), cfg.Issuer)
		if err != nil {
			return nil, fmt.Errorf("OIDC discovery for issuer %s (if the issuer publishes no /.well-known/openid-configuration, set --jwks_uri): %w", cfg.Issuer, err)
		}
		var doc struct {
			JWKSURI string `json:"jwks_uri"`
		}
		if err := p.Claims(&doc); err != nil || doc.JWKSURI == "" {
			return nil, fmt.Errorf("OIDC discovery for issuer %s: the document names no jwks_uri (set --jwks_uri)", cfg.Issuer)
		}
		jwksURL = doc.JWKSURI
	}
	if err := checkJWKS(ctx, client, jwksURL); err != nil {
		return nil, err
	}
	keys := newLimitedKeySet(client, jwksURL, cfg.KeyRefreshInterval)
	v := oidc.NewVerifier(cfg.Issuer, keys, &oidc.Config{
		ClientID:             cfg.Audience,
		SupportedSigningAlgs: cfg.Algorithms,
		// Checked by verify, with leeway.
		SkipExpiryCheck: true,
	})
	return &jwtVerifier{verifier: v, leeway: cfg.Leeway, now: time.Now, groups: cfg.GroupsClaim}, nil
}

// checkJWKS fetches the key set once at startup, so that a wrong URL is
// reported then and not as every caller's 401.
func checkJWKS(ctx context.Context, client *http.Client, jwksURL string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, jwksURL, nil)
	if err != nil {
		return fmt.Errorf("JWKS URL %q: %w", jwksURL, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("fetch the issuer's keys: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("fetch the issuer's keys from %s: %w", jwksURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("fetch the issuer's keys from %s: %s", jwksURL, resp.Status)
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil || len(set.Keys) == 0 {
		return fmt.Errorf("%s is not a JSON Web Key Set with keys (check --jwks_uri or the issuer's jwks_uri)", jwksURL)
	}
	return nil
}

// verify checks a raw JWT and returns its caller and expiry. Every error
// wraps auth.ErrInvalidToken, so the caller gets 401, not 500.
func (j *jwtVerifier) verify(ctx context.Context, raw string) (*Identity, time.Time, error) {
	tok, err := j.verifier.Verify(ctx, raw)
	if err != nil {
		return nil, time.Time{}, invalidToken(strings.TrimPrefix(err.Error(), "oidc: "))
	}
	var claims map[string]any
	if err := tok.Claims(&claims); err != nil {
		return nil, time.Time{}, invalidToken("unreadable claims: " + err.Error())
	}
	if err := j.checkTimes(tok.Expiry, claims); err != nil {
		return nil, time.Time{}, err
	}
	if tok.Subject == "" {
		return nil, time.Time{}, invalidToken("the token has no sub claim")
	}
	if err := checkProviderIdentity(tok.Issuer, tok.Subject); err != nil {
		return nil, time.Time{}, err
	}
	id := &Identity{
		Kind:      KindOIDC,
		Issuer:    tok.Issuer,
		Groups:    claimStrings(claims[j.groups]),
		Subject:   tok.Subject,
		ClientID:  claimString(claims, "client_id"),
		ProjectID: claimString(claims, "project_id"),
		Scopes:    scopesOf(claims),
		claims:    claims,
	}
	if id.ClientID == "" {
		id.ClientID = claimString(claims, "azp")
	}
	// An address the issuer has not verified may be one the user typed:
	// rules must not match on it.
	if verified, _ := claims["email_verified"].(bool); verified {
		id.Email = claimString(claims, "email")
	}
	return id, tok.Expiry, nil
}

// checkTimes checks exp (required), nbf and iat against the clock with
// the configured leeway.
func (j *jwtVerifier) checkTimes(exp time.Time, claims map[string]any) error {
	now := j.now()
	if exp.IsZero() {
		return invalidToken("the token has no exp claim; tokens that never expire are refused")
	}
	if now.After(exp.Add(j.leeway)) {
		return invalidToken(fmt.Sprintf("the token expired at %s", exp.UTC().Format(time.RFC3339)))
	}
	if nbf, ok := numericDate(claims["nbf"]); ok && now.Add(j.leeway).Before(nbf) {
		return invalidToken(fmt.Sprintf("the token is not valid before %s", nbf.UTC().Format(time.RFC3339)))
	}
	if iat, ok := numericDate(claims["iat"]); ok && now.Add(j.leeway).Before(iat) {
		return invalidToken(fmt.Sprintf("the token was issued in the future (%s); check the issuer's clock", iat.UTC().Format(time.RFC3339)))
	}
	return nil
}

func numericDate(v any) (time.Time, bool) {
	f, ok := v.(float64)
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, 0).Add(time.Duration(f * float64(time.Second))), true
}

func invalidToken(msg string) error { return fmt.Errorf("%w: %s", auth.ErrInvalidToken, msg) }

// limitedKeySet is go-oidc's remote key set with its fetches rate-limited:
// go-oidc refetches the JWKS whenever a token names a key it does not
// hold (and when a known key's signature fails), so without a limit any
// caller could make the gateway hammer the issuer. Keys published by the
// issuer are picked up at the next allowed fetch, without a restart.
type limitedKeySet struct {
	remote  *oidc.RemoteKeySet
	limiter *fetchLimiter
}

func newLimitedKeySet(client *http.Client, jwksURL string, every time.Duration) *limitedKeySet {
	l := &fetchLimiter{base: client.Transport, every: every, now: time.Now}
	if l.base == nil {
		l.base = http.DefaultTransport
	}
	limited := &http.Client{Transport: l, Timeout: client.Timeout, CheckRedirect: client.CheckRedirect}
	// go-oidc keeps the context only as a carrier of the HTTP client.
	remote := oidc.NewRemoteKeySet(oidc.ClientContext(context.Background(), limited), jwksURL)
	return &limitedKeySet{remote: remote, limiter: l}
}

// VerifySignature implements oidc.KeySet.
func (k *limitedKeySet) VerifySignature(ctx context.Context, jwt string) ([]byte, error) {
	payload, err := k.remote.VerifySignature(ctx, jwt)
	var limited *refetchLimitedError
	if errors.As(err, &limited) {
		return nil, limited
	}
	return payload, err
}

// fetchLimiter lets one request through per interval and fails the others
// at once.
type fetchLimiter struct {
	base  http.RoundTripper
	every time.Duration
	now   func() time.Time

	mu   sync.Mutex
	last time.Time
}

func (l *fetchLimiter) RoundTrip(r *http.Request) (*http.Response, error) {
	l.mu.Lock()
	now := l.now()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		err := &refetchLimitedError{ago: now.Sub(l.last), every: l.every}
		l.mu.Unlock()
		return nil, err
	}
	l.last = now
	l.mu.Unlock()
	return l.base.RoundTrip(r)
}

// refetchLimitedError refuses a token that no key the gateway holds
// verifies, while the key set was fetched too recently to fetch it again.
type refetchLimitedError struct {
	ago, every time.Duration
}

func (e *refetchLimitedError) Error() string {
	return fmt.Sprintf("the signature matches none of the issuer's keys (key set fetched %s ago, and fetched at most every %s)",
		e.ago.Round(time.Millisecond), e.every)
}
