// Package access decides who calls the gateway and what each caller may
// reach.
//
// It holds caller authentication (bearer JWTs verified with go-oidc,
// static API tokens, and the Authenticator that serves the OAuth
// protected-resource metadata), the caller identities the gateway signs
// into calls (issuer-qualified, so that an API token, the local caller
// and an identity provider's user never pass for one another), the
// access rules and their file, the grants and decisions they give one
// caller, and the per-caller rate limits.
//
// The gateway wires it in: it applies the decisions to MCP requests and
// records them in the audit trail. This package must not import the
// gateway package nor any other package under gateway/; the tool names
// the rules speak of live in protocol.
package access
