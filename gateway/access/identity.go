package access

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// IdentityKind says how a caller was authenticated.
type IdentityKind string

const (
	// KindOIDC is a caller with a verified JWT from the configured issuer.
	KindOIDC IdentityKind = "oidc"
	// KindAPIToken is a caller with a static API token from the tokens file.
	KindAPIToken IdentityKind = "api_token"
	// KindLocal is the single caller of a gateway whose authentication is
	// off (--dev, --no_auth); it may do everything.
	KindLocal IdentityKind = "local"
	// KindAgent is a host's agent enrolling or renewing its credential
	// (audit records only: its subject is the agent's public key).
	KindAgent IdentityKind = "agent"
	// KindUnverified is the caller a message claimed that its host
	// refused (audit records only): nobody vouches for it.
	KindUnverified IdentityKind = "unverified"
	// KindHostReport marks the summary records of a host's reports
	// about messages no call of the gateway sent it (audit records
	// only: its subject is the host, and no caller is named).
	KindHostReport IdentityKind = "host_report"
)

// Identity is an authenticated caller. It is built once per request by
// the Authenticator and never leaves the gateway: agents see only
// Caller().
type Identity struct {
	Kind IdentityKind
	// Issuer is the token's iss (OIDC callers).
	Issuer   string
	Subject  string // sub claim, or the API token's name
	Email    string // only when the issuer did not mark it unverified
	ClientID string // client_id claim, else azp
	// ProjectID is the token's project_id claim, recorded in the audit.
	ProjectID string
	Scopes    []string
	// Groups are the values of the configured groups claim
	// (AuthConfig.GroupsClaim), which hosts' policies may match.
	Groups []string
	// claims are the verified JWT's claims (nil for other kinds).
	claims map[string]any
	// token is the API token's own entry (nil for other kinds).
	token *apiToken
}

// identityKey is where an Identity travels in auth.TokenInfo.Extra.
const identityKey = "fleetmcp.identity"

// LocalIdentity returns the caller of a gateway whose authentication is
// off.
func LocalIdentity() *Identity { return &Identity{Kind: KindLocal, Subject: localSubject} }

// Subjects hosts see for the gateway's own callers: an API token is
// iss protocol.IssuerAPIToken, sub apiTokenSubjectPrefix+NAME; the local
// caller iss protocol.IssuerLocal, sub localSubject.
const (
	apiTokenSubjectPrefix = "token:"
	localSubject          = "local"
)

// Name is how messages and logs name the caller: the e-mail address when
// there is one, otherwise the subject.
func (id *Identity) Name() string {
	switch {
	case id.Kind == KindAPIToken:
		return "token " + id.Subject
	case id.Email != "":
		return id.Email
	default:
		return id.Subject
	}
}

// Caller is what agents learn about the caller: who, never how. The
// gateway signs its issuer, subject, client id and groups into every
// call's envelope, and host policies decide on them.
func (id *Identity) Caller() protocol.Caller {
	switch id.Kind {
	case KindLocal:
		return protocol.Caller{Issuer: protocol.IssuerLocal, Subject: localSubject, Name: "authentication disabled"}
	case KindAPIToken:
		return protocol.Caller{Issuer: protocol.IssuerAPIToken, Subject: apiTokenSubjectPrefix + id.Subject, Name: id.Name()}
	default:
		return protocol.Caller{Issuer: id.Issuer, Subject: id.Subject, Name: id.Email, ClientID: id.ClientID, Groups: id.Groups}
	}
}

// checkProviderIdentity refuses an identity provider's token whose
// issuer or subject is in a namespace the gateway gives its own callers.
// Hosts tell callers apart by issuer and subject together, and the issuer
// of a provider's token is its URL (config refuses any other), so the
// subject check is not what keeps them apart on a current agent: it keeps
// a host whose agent is one minor version older, whose policy may match
// sub: [token:deploy] without iss, from taking a provider's token with
// that subject for the API token deploy.
func checkProviderIdentity(iss, sub string) error {
	switch {
	case !strings.HasPrefix(iss, "https://") && !strings.HasPrefix(iss, "http://"):
		return invalidToken(fmt.Sprintf("issuer %q is not an http(s) URL", iss))
	case strings.HasPrefix(sub, apiTokenSubjectPrefix):
		return invalidToken(fmt.Sprintf("sub %q begins with %q, which names this gateway's API tokens to hosts: the identity provider must not issue such subjects", protocol.Clip(sub, 80), apiTokenSubjectPrefix))
	case sub == localSubject:
		return invalidToken(fmt.Sprintf("sub %q names the local caller of a gateway without authentication to hosts: the identity provider must not issue it", sub))
	}
	return nil
}

// claimValues returns the values of a claim as strings, for rule
// matching. Lists give one value per element; objects give none.
func (id *Identity) claimValues(claim string) []string {
	switch claim {
	case "iss":
		// The issuer hosts see, which tells API tokens and the local
		// caller from the identity provider's callers.
		return nonEmpty(id.Caller().Issuer)
	case "sub":
		return nonEmpty(id.Subject)
	case "email":
		return nonEmpty(id.Email)
	case "client_id":
		return nonEmpty(id.ClientID)
	case "scope":
		return id.Scopes
	}
	return claimStrings(id.claims[claim])
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

// claimStrings flattens a JSON claim value to strings: a string, number or
// boolean gives one; a list gives one per scalar element.
func claimStrings(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case float64:
		return []string{strconv.FormatFloat(v, 'f', -1, 64)}
	case bool:
		return []string{strconv.FormatBool(v)}
	case []any:
		var out []string
		for _, e := range v {
			if _, nested := e.([]any); !nested {
				out = append(out, claimStrings(e)...)
			}
		}
		return out
	}
	return nil
}

// claimString returns a single-valued claim as a string ("" if absent or
// not a scalar).
func claimString(claims map[string]any, name string) string {
	if _, isList := claims[name].([]any); isList {
		return ""
	}
	if v := claimStrings(claims[name]); len(v) == 1 {
		return v[0]
	}
	return ""
}

// scopesOf reads the granted scopes: "scope" (space-separated, RFC 9068)
// or "scp" (a list or a string, as some issuers send).
func scopesOf(claims map[string]any) []string {
	if s, ok := claims["scope"].(string); ok {
		return strings.Fields(s)
	}
	switch v := claims["scp"].(type) {
	case string:
		return strings.Fields(v)
	case []any:
		return claimStrings(v)
	}
	return nil
}

// tokenInfo wraps id for the SDK's bearer middleware. UserID binds MCP
// sessions to their caller, so it is the caller as hosts see it, issuer
// and subject: no caller of one issuer can take up a session of another's
// caller with the same subject.
func (id *Identity) tokenInfo() *auth.TokenInfo {
	return &auth.TokenInfo{UserID: id.Qualified(), Scopes: id.Scopes, Extra: map[string]any{identityKey: id}}
}

// Qualified is the caller's issuer and subject in one string, which
// differs whenever either does: the issuer's length comes first. It keys
// what belongs to one caller (MCP sessions, rate-limit buckets).
func (id *Identity) Qualified() string {
	c := id.Caller()
	return strconv.Itoa(len(c.Issuer)) + ":" + c.Issuer + " " + c.Subject
}

// FromTokenInfo returns the caller the Authenticator put in ti (nil when
// ti is nil or holds none).
func FromTokenInfo(ti *auth.TokenInfo) *Identity {
	if ti == nil {
		return nil
	}
	id, _ := ti.Extra[identityKey].(*Identity)
	return id
}
