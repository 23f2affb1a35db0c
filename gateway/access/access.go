package access

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file decides what an authenticated caller may reach: access rules
// map caller identity (claims) to host selectors, tools and the admin
// flag. Deny wins; a caller no rule matches gets nothing. The file format
// is in accessfile.go.

// Tools the rules know (protocol names them all). Per-host tools
// (protocol.HostTools) are granted per host; admin tools
// (protocol.AdminTools) change or inspect the fleet as a whole and need
// admin: true; hosts is open to every caller that may use some host.

// hostToolNames are the tools that act on one host and that access rules
// grant by name.
func hostToolNames() []string { return protocol.GrantedTools() }

// taskToolNames are the per-host tools that report and stop the
// background tasks bash starts. They are not granted by name: whoever may
// use bash on a host may use them there, and nobody else.
func taskToolNames() []string { return protocol.TaskTools() }

// grantedAs returns the tool whose grant decides tool: bash for the task
// tools, the tool itself otherwise.
func grantedAs(tool string) string {
	if t, ok := protocol.HostTool(tool); ok && t.ComesWith != "" {
		return t.ComesWith
	}
	return tool
}

// Rules decide what each caller may reach. Build them with
// ParseRules or LoadRules; the zero value has no rules.
type Rules struct {
	// Source names where the rules came from, for messages.
	Source string
	rules  []*rule
	// path is the file LoadRules read, which a reload reads again.
	path string
}

// Path returns the file LoadRules read the rules from ("" when they were
// parsed from memory): a reload reads it again.
func (a *Rules) Path() string { return a.path }

// Len returns the number of rules.
func (a *Rules) Len() int { return len(a.rules) }

// rule is one compiled access rule (or an API token's grant).
type rule struct {
	name  string
	deny  bool
	match []condition // all must hold; empty only for API-token grants
	hosts []policy.Selector
	tools map[string]bool // per-host tools
	admin bool
	rate  RateLimit // zero: the gateway default
}

// condition is one claim test: the claim must have a value matching one of
// the patterns.
type condition struct {
	claim    string
	patterns []string
}

func (c condition) holds(id *Identity) bool {
	for _, v := range id.claimValues(c.claim) {
		if c.claim == "email" {
			v = strings.ToLower(v)
		}
		for _, p := range c.patterns {
			if policy.Glob(p, v) {
				return true
			}
		}
	}
	return false
}

func (r *rule) matches(id *Identity) bool {
	for _, c := range r.match {
		if !c.holds(id) {
			return false
		}
	}
	return len(r.match) > 0
}

func (r *rule) selects(host string, labels map[string]string) bool {
	for _, s := range r.hosts {
		if s.Match(host, labels) {
			return true
		}
	}
	return false
}

// Grants are the rules that apply to one caller: built per call by For.
type Grants struct {
	caller string
	all    bool // authentication off: the local caller may do everything
	allow  []*rule
	deny   []*rule
}

// For returns the grants of id. An API token is granted what its own
// entry says; the deny rules of a (possibly nil) rule set apply to every
// caller.
func (a *Rules) For(id *Identity) *Grants {
	if id == nil {
		return &Grants{caller: "unauthenticated caller"}
	}
	g := &Grants{caller: id.Name(), all: id.Kind == KindLocal}
	if id.token != nil {
		g.allow = append(g.allow, id.token.grant)
	}
	if a == nil {
		return g
	}
	for _, r := range a.rules {
		switch {
		case !r.matches(id):
		case r.deny:
			g.deny = append(g.deny, r)
		case id.Kind == KindOIDC:
			g.allow = append(g.allow, r)
		}
	}
	return g
}

// Decision is the outcome of an access check. Rule names the rule that
// decided (the granting rule, or the deny rule that refused); a refusal
// without a rule means no rule granted it.
type Decision struct {
	Allowed bool
	Rule    string
	Reason  string
}

// AllowedBy is the decision that allows a call by rule r ("": by no rule
// in particular).
func AllowedBy(r string) Decision { return Decision{Allowed: true, Rule: r} }

// DeniedBy is the decision that refuses a call by rule r ("": no rule
// granted it) for reason.
func DeniedBy(r, reason string) Decision { return Decision{Rule: r, Reason: reason} }

// Tool decides whether the caller may use a per-host tool on a host.
func (g *Grants) Tool(tool, host string, labels map[string]string) Decision {
	tool = grantedAs(tool)
	if g.all {
		return AllowedBy("authentication off")
	}
	for _, r := range g.deny {
		if r.tools[tool] && r.selects(host, labels) {
			return DeniedBy(r.name, fmt.Sprintf("%s on %s refused by rule %s", tool, host, r.name))
		}
	}
	for _, r := range g.allow {
		if r.tools[tool] && r.selects(host, labels) {
			return AllowedBy(r.name)
		}
	}
	return DeniedBy("", fmt.Sprintf("no access rule grants %s on %s", tool, host))
}

// HostVisible reports whether the caller may use any tool on a host; only
// such hosts are listed to it, and every other host looks unknown.
func (g *Grants) HostVisible(host string, labels map[string]string) bool {
	for _, t := range hostToolNames() {
		if g.Tool(t, host, labels).Allowed {
			return true
		}
	}
	return false
}

// ToolVisible reports whether tools/list shows a tool to the caller: an
// admin tool to admins, hosts to callers with any per-host tool, and a
// per-host tool when some rule grants it and no deny rule takes it away
// on every host (the task tools when bash is shown).
func (g *Grants) ToolVisible(tool string) bool {
	tool = grantedAs(tool)
	switch {
	case g.all:
		return true
	case protocol.IsAdminTool(tool):
		return g.Admin().Allowed
	case tool == protocol.ToolHosts:
		return slices.ContainsFunc(hostToolNames(), g.ToolVisible)
	case protocol.FanoutBase(tool) != "":
		return g.ToolVisible(protocol.FanoutBase(tool))
	}
	for _, r := range g.deny {
		if r.tools[tool] && slices.ContainsFunc(r.hosts, policy.Selector.All) {
			return false
		}
	}
	return slices.ContainsFunc(g.allow, func(r *rule) bool { return r.tools[tool] })
}

// Admin decides whether the caller may use admin tools.
func (g *Grants) Admin() Decision {
	if g.all {
		return AllowedBy("authentication off")
	}
	for _, r := range g.deny {
		if r.admin {
			return DeniedBy(r.name, "admin refused by rule "+r.name)
		}
	}
	for _, r := range g.allow {
		if r.admin {
			return AllowedBy(r.name)
		}
	}
	return DeniedBy("", "no access rule makes this caller an admin")
}

// Summary describes the rules, one line per rule, for the startup log.
func (a *Rules) Summary() []string {
	if a == nil {
		return nil
	}
	out := make([]string, len(a.rules))
	for i, r := range a.rules {
		out[i] = r.String()
	}
	return out
}

// String describes a rule in one line.
func (r *rule) String() string {
	var b strings.Builder
	effect := "allow"
	if r.deny {
		effect = "deny"
	}
	fmt.Fprintf(&b, "%s %s", effect, r.name)
	for i, c := range r.match {
		sep := " and"
		if i == 0 {
			sep = ": when"
		}
		fmt.Fprintf(&b, "%s %s in [%s]", sep, c.claim, strings.Join(c.patterns, ", "))
	}
	if len(r.hosts) > 0 {
		hosts := make([]string, len(r.hosts))
		for i, s := range r.hosts {
			hosts[i] = s.String()
		}
		fmt.Fprintf(&b, "; tools [%s] on hosts [%s]", strings.Join(r.toolList(), ", "), strings.Join(hosts, ", "))
	}
	if r.admin {
		b.WriteString("; admin")
	}
	return b.String()
}

// toolList returns the rule's tools in their canonical order.
func (r *rule) toolList() []string {
	var out []string
	for _, t := range hostToolNames() {
		if r.tools[t] {
			out = append(out, t)
		}
	}
	return out
}
