package policy

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file is the callers section of a host policy: rules for the
// callers the gateway authenticated, by the claims the gateway signed
// into the call's envelope (issuer, subject, client id, groups).
//
//	callers:
//	  - name: deploy                  # optional; default "callers[N]"
//	    match: {client_id: [ci-deploy]}
//	    tools: {allow: [read, patch]}
//	    paths: {allow: ["/srv/app/**"]}
//	  - name: sre
//	    match: {groups: [sre]}
//	  - name: others
//	    match: {sub: ["*"]}
//	    tools: {deny: [bash]}
//
// The first entry whose match holds applies to a call: every claim it
// lists must have a value matching one of its patterns (globs: * and ?).
// Its tools, paths and bash rules apply on top of the host-wide rules
// and can only narrow them: a call must pass both. A caller that no
// entry matches may use nothing on the host. Without a callers section
// every caller gets the host-wide rules. The gateway cannot widen any of
// it: the agent decides, after checking the envelope's signature, on the
// caller the envelope names.
//
// A caller is who its issuer says: the same subject from two issuers is
// two callers. The gateway signs an identity provider's callers with the
// provider's issuer (an http(s) URL: it refuses any other), API tokens
// with protocol.IssuerAPIToken and subject "token:NAME", and the local
// caller of a gateway without authentication with protocol.IssuerLocal,
// so no identity provider can speak for an API token. An entry that
// names a subject is held to one kind of caller: see entryIssuers.

// callerSpec is one entry of the callers section as written.
type callerSpec struct {
	Name  string      `yaml:"name" json:"name,omitempty"`
	Match callerMatch `yaml:"match" json:"match"`
	Tools listRules   `yaml:"tools" json:"tools,omitzero"`
	Paths pathLists   `yaml:"paths" json:"paths,omitzero"`
	Bash  listRules   `yaml:"bash" json:"bash,omitzero"`
}

// callerMatch are the claims an entry matches.
type callerMatch struct {
	Iss      entries `yaml:"iss" json:"iss,omitempty"`
	Sub      entries `yaml:"sub" json:"sub,omitempty"`
	ClientID entries `yaml:"client_id" json:"client_id,omitempty"`
	Groups   entries `yaml:"groups" json:"groups,omitempty"`
}

func (m *callerMatch) empty() bool {
	return len(m.Iss) == 0 && len(m.Sub) == 0 && len(m.ClientID) == 0 && len(m.Groups) == 0
}

// Caller is who a call is for, as the gateway authenticated them and
// signed into the call's envelope.
type Caller struct {
	Issuer, Subject, ClientID string
	Groups                    []string
}

// String names the caller in messages: with its issuer, unless that is
// the gateway's own (API tokens, the local caller), whose subjects say
// it ("token:NAME", "local").
func (c Caller) String() string {
	s := c.Subject
	if c.Issuer != "" && c.Issuer != protocol.IssuerAPIToken && c.Issuer != protocol.IssuerLocal {
		s += " of " + c.Issuer
	}
	if c.ClientID != "" {
		s += " (client " + c.ClientID + ")"
	}
	return s
}

// callerRule is a compiled entry.
type callerRule struct {
	name  string
	match callerMatch
	// rules are the entry's own rules, compiled as a policy of their
	// own for the same host (nil: the entry narrows nothing).
	rules *Policy
}

func (r *callerRule) matches(c Caller) bool {
	any := func(pats []string, values ...string) bool {
		for _, v := range values {
			for _, p := range pats {
				if Glob(p, v) {
					return true
				}
			}
		}
		return false
	}
	m := &r.match
	return (len(m.Iss) == 0 || any(m.Iss, c.Issuer)) &&
		(len(m.Sub) == 0 || any(m.Sub, c.Subject)) &&
		(len(m.ClientID) == 0 || any(m.ClientID, c.ClientID)) &&
		(len(m.Groups) == 0 || any(m.Groups, c.Groups...))
}

// normaliseCallers trims and sorts each entry's lists; the entries keep
// their order, which decides.
func (r *rules) normaliseCallers() {
	oneSpace := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	for i := range r.Callers {
		c := &r.Callers[i]
		c.Name = strings.TrimSpace(c.Name)
		for _, l := range []*entries{
			&c.Match.Iss, &c.Match.Sub, &c.Match.ClientID, &c.Match.Groups,
			&c.Tools.Allow, &c.Tools.Deny, &c.Paths.Allow, &c.Paths.Deny,
			&c.Paths.Read.Allow, &c.Paths.Read.Deny, &c.Paths.Write.Allow, &c.Paths.Write.Deny,
		} {
			*l = normaliseList(*l, strings.TrimSpace)
		}
		c.Bash.Allow = normaliseList(c.Bash.Allow, oneSpace)
		c.Bash.Deny = normaliseList(c.Bash.Deny, oneSpace)
	}
}

// compileCallers compiles the callers section. An entry's rules are
// compiled for the same host; its command rules may let git run only
// when the host-wide rules have command rules too, for only then does
// the agent run git through its git guard.
func (p *Policy) compileCallers() []error {
	var errs []error
	names := map[string]bool{}
	for i, spec := range p.rules.Callers {
		name := spec.Name
		if name == "" {
			name = "callers[" + strconv.Itoa(i) + "]"
		}
		where := fmt.Sprintf("callers[%d] (%s)", i, name)
		if names[name] {
			errs = append(errs, fmt.Errorf("%s: another entry has the same name; give each its own", where))
		}
		names[name] = true
		if spec.Match.empty() {
			errs = append(errs, fmt.Errorf("%s: match names no claim (iss, sub, client_id, groups); to match every caller write match: {sub: [\"*\"]}", where))
		}
		for _, pats := range [][]string{spec.Match.Iss, spec.Match.Sub, spec.Match.ClientID, spec.Match.Groups} {
			if slices.Contains(pats, "") {
				errs = append(errs, fmt.Errorf("%s: match has an empty pattern", where))
			}
		}
		own := rules{Tools: spec.Tools, Paths: spec.Paths, Bash: bashRules{Allow: spec.Bash.Allow, Deny: spec.Bash.Deny}}
		env := p.env
		env.GitGuarded = env.GitGuarded && !p.rules.Bash.empty()
		iss, err := entryIssuers(spec.Match)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
		r := &callerRule{name: name, match: spec.Match}
		r.match.Iss = iss
		if !own.empty() {
			sub, err := compile(own, env)
			if err != nil {
				errs = append(errs, prefixErrors(where, err))
				continue
			}
			r.rules = sub
		}
		p.callers = append(p.callers, r)
	}
	return errs
}

// prefixErrors prefixes every error joined in err with where.
func prefixErrors(where string, err error) error {
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) {
		return fmt.Errorf("%s: %w", where, err)
	}
	var out []error
	for _, e := range joined.Unwrap() {
		out = append(out, fmt.Errorf("%s: %w", where, e))
	}
	return errors.Join(out...)
}

// HasCallerRules reports whether the policy has a callers section.
func (p *Policy) HasCallerRules() bool { return p != nil && len(p.callers) > 0 }

// ForCaller returns the policy a call for c is held to: p itself when p
// has no callers section, else p narrowed by the first entry that
// matches c. When none matches it returns a *Denial: c may use nothing
// on this host.
func (p *Policy) ForCaller(c Caller) (*Policy, error) {
	if !p.HasCallerRules() {
		return p, nil
	}
	for _, r := range p.callers {
		if !r.matches(c) {
			continue
		}
		if r.rules == nil {
			return p, nil
		}
		v := *p
		v.narrow, v.narrowName = r.rules, "callers."+r.name
		return &v, nil
	}
	return nil, &Denial{"callers", fmt.Sprintf("caller %s matches no entry of this host's callers rules, so it may use nothing here", c)}
}

// narrowed renames the rule of a denial by an entry's own rules after the
// entry.
func (p *Policy) narrowed(err error) error {
	var d *Denial
	if err == nil || !errors.As(err, &d) {
		return err
	}
	return &Denial{Rule: p.narrowName + "." + d.Rule, Reason: d.Reason + " (for this caller: " + p.narrowName + ")"}
}
