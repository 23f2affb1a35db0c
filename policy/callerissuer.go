package policy

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// apiTokenSubjectPrefix starts the subject of every API token caller
// ("token:NAME"); its issuer is protocol.IssuerAPIToken.
const apiTokenSubjectPrefix = "token:"

// entryIssuers returns the issuer patterns an entry's match is held to,
// or an error when its subjects could be claimed by a caller of another
// issuer than the one the entry was written for.
//
//   - An entry that names no subject (no sub, or sub "*", which names
//     nobody) matches as written: client ids and groups come only from
//     the identity provider's tokens, never from API tokens or the local
//     caller.
//   - An entry that names subjects and says iss is held to that iss; an
//     iss that matches both the gateway's own issuers and an identity
//     provider's URL (such as "*", or a list of one of each) is refused,
//     for it would let a provider's "token:deploy" be the API token
//     deploy again.
//   - An entry that names subjects without iss was written before
//     entries said their issuer. If every subject it names is "token:…",
//     it was written for API tokens: it matches API tokens only, so an
//     identity provider's "token:deploy" gets nothing from it. If none
//     of them can be an API token's or the local caller's subject (no
//     pattern matches "local" or any "token:…"), it was written for the
//     identity provider's users: it matches callers of an http(s)
//     issuer only. Either way it keeps working and cannot be taken by
//     the other kind of caller.
//   - Any other entry that names subjects without iss ("*deploy",
//     "t*", "local", "token:x" with "y") is refused with how to write
//     it: nothing tells which issuer it meant.
func entryIssuers(m callerMatch) ([]string, error) {
	if len(m.Sub) == 0 || slices.Contains(m.Sub, "*") {
		return m.Iss, nil
	}
	if len(m.Iss) > 0 {
		own := slices.ContainsFunc(m.Iss, matchesOwnIssuer)
		idp := slices.ContainsFunc(m.Iss, mayMatchURL)
		if own && idp {
			return nil, fmt.Errorf("iss %q matches both the gateway's own issuers (%s, %s) and identity providers' URLs, so sub %q would match a caller of either: "+
				"give each its own entry (iss: [%q] for API tokens, iss: [\"https://login.example.com\"] for your identity provider's users), or match every caller with sub: [\"*\"]",
				strings.Join(m.Iss, ", "), protocol.IssuerAPIToken, protocol.IssuerLocal, m.Sub[0], protocol.IssuerAPIToken)
		}
		return m.Iss, nil
	}
	tokens, users := true, true
	var unclear string
	for _, p := range m.Sub {
		token := strings.HasPrefix(p, apiTokenSubjectPrefix)
		user := !globMayMatchPrefix(p, apiTokenSubjectPrefix) && !Glob(p, localSubject)
		tokens, users = tokens && token, users && user
		if !token && !user && unclear == "" {
			unclear = p
		}
	}
	switch {
	case tokens:
		return []string{protocol.IssuerAPIToken}, nil
	case users:
		return providerIssuers(), nil
	}
	if unclear == "" {
		unclear = strings.Join(m.Sub, ", ") // one of each kind
	}
	return nil, fmt.Errorf("sub %q without iss could be an API token's (token:NAME), the local caller's or an identity provider user's subject, and an identity provider's sub \"token:deploy\" is not the API token deploy: "+
		"say whose it is: iss: [\"https://login.example.com\"] (the gateway's --jwt_issuer) for your identity provider's users, "+
		"iss: [%q] with sub: [\"token:NAME\"] for API tokens, iss: [%q] with sub: [local] for a gateway without authentication; sub: [\"*\"] matches every caller",
		unclear, protocol.IssuerAPIToken, protocol.IssuerLocal)
}

// localSubject is the subject of the local caller of a gateway without
// authentication; its issuer is protocol.IssuerLocal.
const localSubject = "local"

// providerIssuers are the issuers an entry written for identity
// provider users without iss is held to: any http(s) URL, which is the
// only issuer the gateway takes from a provider.
func providerIssuers() []string { return []string{"https://*", "http://*"} }

// matchesOwnIssuer reports whether an iss pattern matches one of the
// gateway's own issuers.
func matchesOwnIssuer(p string) bool {
	return Glob(p, protocol.IssuerAPIToken) || Glob(p, protocol.IssuerLocal)
}

// mayMatchURL reports whether an iss pattern may match an identity
// provider's issuer, which the gateway takes only as an http(s) URL.
func mayMatchURL(p string) bool {
	return globMayMatchPrefix(p, "https://") || globMayMatchPrefix(p, "http://")
}

// globMayMatchPrefix reports whether some string that begins with prefix
// (ASCII: the issuers' schemes) matches pattern (a Glob pattern: * and ?). It follows every way the
// pattern can consume the prefix: a star may take any of it, ? one rune,
// a literal only itself; if any way is left with pattern to spare (which
// matches some rest of the string), a string with that prefix matches.
func globMayMatchPrefix(pattern, prefix string) bool {
	at := make([]bool, len(pattern)+1)
	at[0] = true
	starClosure(pattern, at)
	for si := 0; si < len(prefix); {
		// Taken by runes as Glob takes strings; with an ASCII prefix a
		// rune of it is one of the string's whatever follows.
		_, sn := utf8.DecodeRuneInString(prefix[si:])
		next := make([]bool, len(pattern)+1)
		any := false
		for pi, ok := range at {
			if !ok || pi == len(pattern) {
				continue
			}
			switch pattern[pi] {
			case '*':
				next[pi], any = true, true
			case '?':
				next[pi+1], any = true, true
			default:
				// As Glob: a literal rune is its UTF-8 bytes, compared
				// with the same bytes of the string.
				_, pn := utf8.DecodeRuneInString(pattern[pi:])
				if pn == sn && pattern[pi:pi+pn] == prefix[si:si+sn] {
					next[pi+pn], any = true, true
				}
			}
		}
		if !any {
			return false
		}
		starClosure(pattern, next)
		at = next
		si += sn
	}
	return true
}

// starClosure marks, for every marked position at a star, the position
// after it too: a star may match nothing.
func starClosure(pattern string, at []bool) {
	for pi := 0; pi < len(pattern); pi++ {
		if at[pi] && pattern[pi] == '*' {
			at[pi+1] = true
		}
	}
}
