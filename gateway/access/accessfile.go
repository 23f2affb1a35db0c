package access

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The access rules file (YAML, or JSON, which YAML reads too):
//
//	rules:
//	  - name: ops                    # optional; default "rule N"
//	    match:                       # every listed claim must match
//	      groups: [ops, sre]         # a string or a list: any may match
//	    hosts: ["*"]                 # host selectors (policy.ParseSelector)
//	    tools: ["*"]                 # per-host tools, or "*" for all
//	    admin: true                  # admin tools (audit)
//	    rate_limit: 600/min          # calls per caller (ratelimit.go)
//	  - name: no-prod-changes
//	    deny: true                   # deny wins over any allow
//	    match: {sub: "*"}            # "*": every authenticated caller
//	    hosts: [env=prod]
//	    tools: [write, edit, patch, bash]
//
// match keys: iss, sub, email (case-insensitive; ignored when the issuer
// marks it unverified), groups, roles, client_id (or azp), scope, and
// claims (a map from any other claim name to patterns). Patterns are
// globs (* and ?). Unknown keys anywhere are errors.
//
// iss is the caller's issuer as hosts see it: the identity provider's URL,
// protocol.IssuerAPIToken for API tokens (whose sub here is the token's
// name), protocol.IssuerLocal for the local caller. Allow rules apply to
// the identity provider's callers only (API tokens carry their own
// grants), so their sub is always the provider's subject; a deny rule
// without iss applies to every caller whose subject matches, an API
// token of that name included: deny errs on the side of refusing.

// maxRulesFile bounds a rules or tokens file.
const maxRulesFile = 4 << 20

// accessFile is the rules file as written.
type accessFile struct {
	Rules []ruleSpec `yaml:"rules"`
}

type ruleSpec struct {
	Name      string     `yaml:"name"`
	Deny      bool       `yaml:"deny"`
	Match     *matchSpec `yaml:"match"`
	grantSpec `yaml:",inline"`
}

// grantSpec is what a rule or an API token grants (or a deny rule takes
// away).
type grantSpec struct {
	Hosts stringList `yaml:"hosts"`
	Tools stringList `yaml:"tools"`
	Admin bool       `yaml:"admin"`
	// RateLimit bounds each caller the grant applies to (ratelimit.go).
	RateLimit string `yaml:"rate_limit"`
}

type matchSpec struct {
	Iss      stringList            `yaml:"iss"`
	Sub      stringList            `yaml:"sub"`
	Email    stringList            `yaml:"email"`
	Groups   stringList            `yaml:"groups"`
	Roles    stringList            `yaml:"roles"`
	ClientID stringList            `yaml:"client_id"`
	Scope    stringList            `yaml:"scope"`
	Claims   map[string]stringList `yaml:"claims"`
}

// stringList is a YAML string or list of strings.
type stringList []string

func (l *stringList) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*l = stringList{n.Value}
		return nil
	case yaml.SequenceNode:
		out := make(stringList, 0, len(n.Content))
		for _, e := range n.Content {
			if e.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: want a string, got a %s", e.Line, kindName(e.Kind))
			}
			out = append(out, e.Value)
		}
		*l = out
		return nil
	}
	return fmt.Errorf("line %d: want a string or a list of strings, got a %s", n.Line, kindName(n.Kind))
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "map"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "YAML alias (quote values that start with '*')"
	}
	return "value"
}

// LoadRules reads and parses the access rules file at path.
func LoadRules(path string) (*Rules, error) {
	data, err := readSmallFile(path)
	if err != nil {
		return nil, fmt.Errorf("access rules: %w", err)
	}
	a, err := ParseRules(path, data)
	if err != nil {
		return nil, err
	}
	a.path = path
	return a, nil
}

func readSmallFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxRulesFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxRulesFile {
		return nil, fmt.Errorf("%s is larger than %d MiB", path, maxRulesFile>>20)
	}
	return data, nil
}

// ParseRules parses an access rules file; name is used in messages.
// Every error names the rule and what is wrong with it.
func ParseRules(name string, data []byte) (*Rules, error) {
	var f accessFile
	if err := decodeStrict(data, &f); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(f.Rules) == 0 {
		return nil, fmt.Errorf("%s has no rules: add a rules: list (without rules no caller may do anything)", name)
	}
	a := &Rules{Source: name}
	seen := map[string]int{}
	var errs []error
	for i, spec := range f.Rules {
		r, err := compileRule(i+1, spec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, dup := seen[r.name]; dup {
			errs = append(errs, fmt.Errorf("rule %d: name %q is already used by rule %d: give each rule its own name", i+1, r.name, prev))
			continue
		}
		seen[r.name] = i + 1
		a.rules = append(a.rules, r)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return a, nil
}

// decodeStrict decodes exactly one YAML (or JSON) document into v,
// refusing unknown keys.
func decodeStrict(data []byte, v any) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return errors.New("the file is empty")
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var te *yaml.TypeError
	if err := dec.Decode(v); errors.Is(err, io.EOF) {
		return errors.New("the file is empty")
	} else if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, e := range te.Errors {
			msgs[i] = explainKey(e)
		}
		return errors.New(strings.Join(msgs, "\n"))
	} else if err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if strings.Contains(msg, "did not find expected alphabetic or numeric character") || strings.Contains(msg, "unknown anchor") {
			msg += ` (a value that starts with '*' must be quoted: "*", "*@example.com")`
		}
		return errors.New(msg)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("more than one YAML document: put every rule under one rules: list")
	}
	return nil
}

// knownKeys lists, per part of a file, the keys it may have, to explain
// the decoder's complaint about an unknown one.
func knownKeys(goType string) (where, keys string) {
	switch goType {
	case "accessFile":
		return "at the top level", "rules"
	case "ruleSpec":
		return "in a rule", "name, deny, match, hosts, tools, admin, rate_limit"
	case "matchSpec":
		return "in match", "iss, sub, email, groups, roles, client_id, scope, claims"
	case "tokensFile":
		return "at the top level", "tokens"
	case "tokenSpec":
		return "in a token", "name, sha256, hosts, tools, admin, rate_limit"
	}
	return "", ""
}

// explainKey rewrites "line N: field X not found in type access.T" into
// a message in the file's own terms.
func explainKey(msg string) string {
	line, rest, ok := strings.Cut(msg, ": field ")
	if !ok {
		return msg
	}
	field, goType, ok := strings.Cut(rest, " not found in type access.")
	if !ok {
		return msg
	}
	where, keys := knownKeys(goType)
	if where == "" {
		return msg
	}
	return fmt.Sprintf("%s: unknown key %q %s (known keys: %s)", line, field, where, keys)
}

func compileRule(n int, spec ruleSpec) (*rule, error) {
	name := strings.TrimSpace(spec.Name)
	label := fmt.Sprintf("rule %d", n)
	if name == "" {
		name = label
	} else {
		label = fmt.Sprintf("rule %d (%s)", n, name)
	}
	if spec.Match == nil {
		return nil, fmt.Errorf(`%s: no match: say whom it applies to, e.g. match: {groups: ops}, or match: {sub: "*"} for every authenticated caller`, label)
	}
	conds, err := spec.Match.compile()
	if err != nil {
		return nil, fmt.Errorf("%s: match: %w", label, err)
	}
	r, err := compileGrant(spec.grantSpec, spec.Deny)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", label, err)
	}
	r.name, r.deny, r.match = name, spec.Deny, conds
	return r, nil
}

func (m *matchSpec) compile() ([]condition, error) {
	named := []struct {
		claim string
		list  stringList
	}{
		{"iss", m.Iss}, {"sub", m.Sub}, {"email", m.Email}, {"groups", m.Groups}, {"roles", m.Roles},
		{"client_id", m.ClientID}, {"scope", m.Scope},
	}
	var conds []condition
	add := func(claim string, list stringList) error {
		if list == nil {
			return nil
		}
		if len(list) == 0 {
			return fmt.Errorf("%s: empty list matches nobody: give at least one pattern", claim)
		}
		pats := make([]string, len(list))
		for i, p := range list {
			if p = strings.TrimSpace(p); p == "" {
				return fmt.Errorf("%s: empty pattern: use \"*\" for any value", claim)
			}
			if claim == "email" {
				p = strings.ToLower(p)
			}
			pats[i] = p
		}
		conds = append(conds, condition{claim: claim, patterns: pats})
		return nil
	}
	ownKey := map[string]bool{}
	for _, f := range named {
		ownKey[f.claim] = true
		if err := add(f.claim, f.list); err != nil {
			return nil, err
		}
	}
	for _, claim := range sortedKeys(m.Claims) {
		switch {
		case strings.TrimSpace(claim) == "":
			return nil, errors.New("claims: empty claim name")
		case ownKey[claim]:
			return nil, fmt.Errorf("claims: %s has its own key: write it directly under match", claim)
		}
		if err := add(claim, m.Claims[claim]); err != nil {
			return nil, fmt.Errorf("claims: %w", err)
		}
	}
	if len(conds) == 0 {
		return nil, errors.New(`no conditions: name at least one claim, e.g. {groups: ops}, or {sub: "*"} for every authenticated caller`)
	}
	return conds, nil
}

// compileGrant checks and compiles hosts, tools and admin.
func compileGrant(spec grantSpec, deny bool) (*rule, error) {
	r := &rule{admin: spec.Admin, tools: map[string]bool{}}
	verb := "grants"
	if deny {
		verb = "refuses"
	}
	switch {
	case len(spec.Hosts) == 0 && len(spec.Tools) == 0 && !spec.Admin:
		return nil, fmt.Errorf(`%s nothing: give hosts and tools (e.g. hosts: ["*"], tools: [read]), or admin: true`, verb)
	case len(spec.Hosts) > 0 && len(spec.Tools) == 0:
		return nil, fmt.Errorf(`hosts without tools: say which tools, e.g. tools: [read, bash] or tools: ["*"]`)
	case len(spec.Tools) > 0 && len(spec.Hosts) == 0:
		return nil, fmt.Errorf(`tools without hosts: say on which hosts, e.g. hosts: ["env=staging"] or hosts: ["*"]`)
	}
	rl, err := ParseRateLimit(spec.RateLimit)
	switch {
	case err != nil:
		return nil, fmt.Errorf("rate_limit: %w", err)
	case deny && !rl.Unlimited():
		return nil, errors.New("rate_limit on a deny rule limits nothing: put it on the rule that grants the caller's access")
	}
	r.rate = rl
	for _, h := range spec.Hosts {
		sel, err := policy.ParseSelector(h)
		if err != nil {
			return nil, fmt.Errorf("hosts: %w", err)
		}
		r.hosts = append(r.hosts, sel)
	}
	for _, t := range spec.Tools {
		if err := r.addTool(strings.TrimSpace(t)); err != nil {
			return nil, fmt.Errorf("tools: %w", err)
		}
	}
	return r, nil
}

func (r *rule) addTool(t string) error {
	switch {
	case t == "*":
		for _, name := range hostToolNames() {
			r.tools[name] = true
		}
	case slices.Contains(hostToolNames(), t):
		r.tools[t] = true
	case t == protocol.ToolHosts:
		// Always open to a caller that may use some host.
	case protocol.IsAdminTool(t):
		return fmt.Errorf("%s is an admin tool: grant it with admin: true", t)
	case slices.Contains(taskToolNames(), t):
		return fmt.Errorf("%s comes with bash: grant bash on the hosts where callers may run and watch background tasks", t)
	default:
		return fmt.Errorf("unknown tool %q: the tools are %s, or \"*\" for all of them", t, strings.Join(hostToolNames(), ", "))
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
