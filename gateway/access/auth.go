package access

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// This file makes the gateway an OAuth 2.1 resource server: every MCP
// request carries a bearer token (a JWT from the configured issuer, or a
// static API token); a missing or refused one gets 401 with a
// WWW-Authenticate header that points at the RFC 9728 protected-resource
// metadata, which names the issuer a client logs in with.

// AuthConfig configures caller authentication. Set Issuer and Audience
// for JWTs, APITokens for static tokens, or both.
type AuthConfig struct {
	// Issuer is the JWT issuer URL (the iss claim). Its discovery document
	// locates the keys unless JWKSURL is set.
	Issuer string
	// Audience must be among a token's aud values; required with Issuer.
	Audience string
	// JWKSURL is the issuer's key set, for issuers without a discovery
	// document.
	JWKSURL string
	// Algorithms are the accepted signature algorithms. Default
	// DefaultAlgorithms(); "none" and HMAC are always refused.
	Algorithms []string
	// Leeway is the clock skew allowed on exp, nbf and iat. Default 30 s.
	Leeway time.Duration
	// KeyRefreshInterval is the shortest time between two fetches of the
	// issuer's key set (a token signed by an unknown key triggers one).
	// Default 30 s.
	KeyRefreshInterval time.Duration
	// ResourceURL is the MCP endpoint's URL as clients reach it (e.g.
	// https://fleet.example.com/mcp), published in the protected-resource
	// metadata. Default: taken from each request's Host header.
	ResourceURL string
	// Scopes are the scopes a client should ask the issuer for, published
	// as scopes_supported.
	Scopes []string
	// GroupsClaim is the JWT claim that lists the caller's groups (a
	// string or a list of strings), which the gateway signs into every
	// call's envelope for host policies to match (callers: groups).
	// Default "groups".
	GroupsClaim string
	// APITokens are static tokens accepted besides (or instead of) JWTs.
	APITokens *APITokens
	// HTTPClient fetches the discovery document and keys. Default: a
	// client with a 10 s timeout.
	HTTPClient *http.Client
}

// Configured reports whether any JWT or API-token setting is given.
func (c *AuthConfig) Configured() bool {
	return c.Issuer != "" || c.Audience != "" || c.JWKSURL != "" || c.APITokens != nil
}

// SetDefaults fills in the defaults of the settings left zero.
func (c *AuthConfig) SetDefaults() {
	if len(c.Algorithms) == 0 {
		c.Algorithms = DefaultAlgorithms()
	}
	if c.Leeway == 0 {
		c.Leeway = 30 * time.Second
	}
	if c.KeyRefreshInterval == 0 {
		c.KeyRefreshInterval = 30 * time.Second
	}
	if c.GroupsClaim == "" {
		c.GroupsClaim = "groups"
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
}

// Validate returns every problem of the settings, each saying which flag
// to fix and how.
func (c *AuthConfig) Validate() []error {
	var errs []error
	switch {
	case c.Issuer == "" && c.Audience != "":
		errs = append(errs, errors.New("--jwt_audience is set but --jwt_issuer is not: name the issuer whose tokens to accept"))
	case c.Issuer == "" && c.JWKSURL != "":
		errs = append(errs, errors.New("--jwks_uri is set but --jwt_issuer is not: tokens are checked against their issuer too"))
	case c.Issuer != "" && c.Audience == "":
		errs = append(errs, errors.New("--jwt_audience is required with --jwt_issuer: tokens issued for other services must be refused (use this gateway's URL or the API identifier your issuer gives it)"))
	}
	for name, raw := range map[string]string{"--jwt_issuer": c.Issuer, "--jwks_uri": c.JWKSURL, "--resource_url": c.ResourceURL} {
		if raw == "" {
			continue
		}
		if u, err := url.Parse(raw); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%s %q is not an http(s) URL", name, raw))
		}
	}
	for _, alg := range c.Algorithms {
		if err := checkAlgorithm(alg); err != nil {
			errs = append(errs, fmt.Errorf("--jwt_algs: %w", err))
		}
	}
	if strings.TrimSpace(c.GroupsClaim) != c.GroupsClaim || len(c.GroupsClaim) > 256 {
		errs = append(errs, fmt.Errorf("groups claim %q: give a claim name without surrounding spaces, at most 256 bytes", c.GroupsClaim))
	}
	if c.Leeway < 0 || c.Leeway > 5*time.Minute {
		errs = append(errs, fmt.Errorf("JWT clock leeway %s is out of range (0 to 5m)", c.Leeway))
	}
	return errs
}

// Authenticator verifies the bearer tokens of MCP and admin API requests.
type Authenticator struct {
	cfg AuthConfig
	jwt *jwtVerifier // nil without an issuer
	// tokens are the API tokens in force; a reload swaps them.
	tokens atomic.Pointer[APITokens]
	log    *slog.Logger
}

// NewAuthenticator finds the issuer's keys, if there is an issuer, within
// 30 s or until ctx ends.
func NewAuthenticator(ctx context.Context, cfg AuthConfig, log *slog.Logger) (*Authenticator, error) {
	a := &Authenticator{cfg: cfg, log: log}
	a.tokens.Store(cfg.APITokens)
	if cfg.Issuer != "" {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		v, err := newJWTVerifier(ctx, &a.cfg)
		if err != nil {
			return nil, err
		}
		a.jwt = v
	}
	return a, nil
}

// Tokens returns the API tokens in force (nil: none).
func (a *Authenticator) Tokens() *APITokens { return a.tokens.Load() }

// SetTokens puts t in force instead of the API tokens before (a reload).
func (a *Authenticator) SetTokens(t *APITokens) { a.tokens.Store(t) }

// verify is the auth.TokenVerifier: it returns the caller in TokenInfo,
// or an error wrapping auth.ErrInvalidToken.
func (a *Authenticator) verify(ctx context.Context, token string, r *http.Request) (*auth.TokenInfo, error) {
	id, exp, err := a.Identify(ctx, token)
	if err != nil {
		a.log.Info("refused bearer token", "remote", r.RemoteAddr, "reason", err)
		return nil, err
	}
	ti := id.tokenInfo()
	ti.Expiration = exp
	return ti, nil
}

// Identify verifies a bearer token (an API token or a JWT) and returns
// its caller and, for a JWT, its expiry. Every error wraps
// auth.ErrInvalidToken.
func (a *Authenticator) Identify(ctx context.Context, token string) (*Identity, time.Time, error) {
	if strings.HasPrefix(token, APITokenPrefix) {
		t := a.tokens.Load().lookup(token)
		if t == nil {
			return nil, time.Time{}, invalidToken("unknown API token")
		}
		return &Identity{Kind: KindAPIToken, Subject: t.name, token: t}, time.Time{}, nil
	}
	if a.jwt == nil {
		return nil, time.Time{}, invalidToken("this gateway accepts only its API tokens (" + APITokenPrefix + "...)")
	}
	return a.jwt.verify(ctx, token)
}

// Protect wraps the MCP handler: every request must carry a valid bearer
// token, whose caller the handler finds with FromTokenInfo.
func (a *Authenticator) Protect(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		opts := &auth.RequireBearerTokenOptions{
			ResourceMetadataURL: a.metadataURL(r),
			// JWTs without exp are refused by verify; API tokens have none.
			AllowMissingExpiration: true,
			ClockSkew:              a.cfg.Leeway,
		}
		auth.RequireBearerToken(a.verify, opts)(next).ServeHTTP(w, r)
	})
}

// resourceURL is the MCP endpoint's URL as this request reached it, unless
// configured.
func (a *Authenticator) resourceURL(r *http.Request) string {
	if a.cfg.ResourceURL != "" {
		return a.cfg.ResourceURL
	}
	scheme := "http"
	if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https"
	}
	return scheme + "://" + r.Host + "/mcp"
}

// metadataURL is where RFC 9728 puts the metadata of the resource: the
// well-known path inserted before the resource's path.
func (a *Authenticator) metadataURL(r *http.Request) string {
	u, err := url.Parse(a.resourceURL(r))
	if err != nil {
		return ""
	}
	u.Path = MetadataPath + strings.TrimSuffix(u.Path, "/")
	u.RawQuery, u.Fragment = "", ""
	return u.String()
}

// MetadataPath is where the protected-resource metadata is served (and,
// with the MCP endpoint's path appended, served again).
const MetadataPath = "/.well-known/oauth-protected-resource"

// Metadata serves the protected-resource metadata (RFC 9728): the
// resource, the issuer to log in with, and the scopes to ask for.
func (a *Authenticator) Metadata() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m := &oauthex.ProtectedResourceMetadata{
			Resource:               a.resourceURL(r),
			ScopesSupported:        a.cfg.Scopes,
			BearerMethodsSupported: []string{"header"},
			ResourceName:           "fleetmcp gateway",
		}
		if a.cfg.Issuer != "" {
			m.AuthorizationServers = []string{a.cfg.Issuer}
		}
		auth.ProtectedResourceMetadataHandler(m).ServeHTTP(w, r)
	})
}
