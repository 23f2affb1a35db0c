package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxFileSize bounds a policy file.
const MaxFileSize = 1 << 20

// rules is a policy file as written, once normalised: lists trimmed,
// sorted and without duplicates, bash patterns with single spaces. Its
// JSON form is what the digest covers.
type rules struct {
	Tools  listRules `yaml:"tools" json:"tools,omitzero"`
	Paths  pathLists `yaml:"paths" json:"paths,omitzero"`
	Bash   bashRules `yaml:"bash" json:"bash,omitzero"`
	Skills listRules `yaml:"skills" json:"skills,omitzero"`
	// Callers narrow the rules for the callers they match (callers.go).
	Callers []callerSpec `yaml:"callers" json:"callers,omitempty"`
}

// listRules are one dimension's allow and deny lists.
type listRules struct {
	Allow entries `yaml:"allow" json:"allow,omitempty"`
	Deny  entries `yaml:"deny" json:"deny,omitempty"`
}

// bashRules are the command rules: the allow and deny lists, and what
// git may run with.
type bashRules struct {
	Allow entries  `yaml:"allow" json:"allow,omitempty"`
	Deny  entries  `yaml:"deny" json:"deny,omitempty"`
	Git   gitRules `yaml:"git" json:"git,omitzero"`
}

// gitRules widen what git may run with under command rules.
type gitRules struct {
	// AllowConfig are configuration keys git may find set, beyond those
	// known to run nothing: "filter.lfs.*", "global:alias.*".
	AllowConfig entries `yaml:"allow_config" json:"allow_config,omitempty"`
}

// pathLists are the path rules: the common lists, then those for reading
// and for writing only.
type pathLists struct {
	Allow entries   `yaml:"allow" json:"allow,omitempty"`
	Deny  entries   `yaml:"deny" json:"deny,omitempty"`
	Read  listRules `yaml:"read" json:"read,omitzero"`
	Write listRules `yaml:"write" json:"write,omitzero"`
}

// entries is a list of names or patterns. The YAML decoder would drop a
// null entry silently, and an allow list emptied that way restricts
// nothing, so every entry must be a string.
type entries []string

// entryError is a malformed list in the policy file.
type entryError struct{ msg string }

func (e *entryError) Error() string { return e.msg }

func (l *entries) UnmarshalYAML(n *yaml.Node) error {
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag == "!!null":
		*l = nil
		return nil
	case n.Kind != yaml.SequenceNode:
		return &entryError{fmt.Sprintf("line %d: %q must be a list, such as [\"git *\"]", n.Line, n.Value)}
	}
	for _, item := range n.Content {
		if item.Kind != yaml.ScalarNode || item.Tag == "!!null" {
			return &entryError{fmt.Sprintf("line %d: a list entry must be a name or a pattern, not %s", item.Line, nodeKind(item))}
		}
		*l = append(*l, item.Value)
	}
	return nil
}

func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.AliasNode:
		return "an alias"
	}
	return "null (write the entry, or quote a \"~\")"
}

func (l listRules) empty() bool { return len(l.Allow) == 0 && len(l.Deny) == 0 }

// empty reports whether there are no command rules: git's rules alone
// restrict nothing.
func (b bashRules) empty() bool { return len(b.Allow) == 0 && len(b.Deny) == 0 }

func (p pathLists) empty() bool {
	return len(p.Allow) == 0 && len(p.Deny) == 0 && p.Read.empty() && p.Write.empty()
}

func (r rules) empty() bool {
	return r.Tools.empty() && r.Paths.empty() && r.Bash.empty() && len(r.Bash.Git.AllowConfig) == 0 && r.Skills.empty() && len(r.Callers) == 0
}

// decodeRules parses a policy file strictly and normalises it.
func decodeRules(data []byte) (rules, error) {
	var r rules
	if len(data) > MaxFileSize {
		return r, fmt.Errorf("policy file is %d bytes; at most %d are allowed", len(data), MaxFileSize)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(&r)
	switch {
	case errors.Is(err, io.EOF):
		return rules{}, nil // empty, or only comments
	case err != nil:
		return r, describeYAMLError(err)
	}
	var more any
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return r, errors.New("policy file holds more than one YAML document (a second ---); keep one")
	}
	r.normalise()
	return r, nil
}

// normalise trims, sorts and deduplicates every list.
func (r *rules) normalise() {
	for _, l := range []*entries{
		&r.Tools.Allow, &r.Tools.Deny, &r.Skills.Allow, &r.Skills.Deny,
		&r.Paths.Allow, &r.Paths.Deny, &r.Paths.Read.Allow, &r.Paths.Read.Deny,
		&r.Paths.Write.Allow, &r.Paths.Write.Deny,
	} {
		*l = normaliseList(*l, strings.TrimSpace)
	}
	oneSpace := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	r.Bash.Allow = normaliseList(r.Bash.Allow, oneSpace)
	r.Bash.Deny = normaliseList(r.Bash.Deny, oneSpace)
	r.Bash.Git.AllowConfig = normaliseList(r.Bash.Git.AllowConfig, normaliseGitPattern)
	r.normaliseCallers()
}

func normaliseList(l entries, clean func(string) string) entries {
	if len(l) == 0 {
		return nil
	}
	out := make(entries, len(l))
	for i, s := range l {
		out[i] = clean(s)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// canonical returns the normalised rules as compact JSON.
func (r rules) canonical() []byte {
	data, err := json.Marshal(r)
	if err != nil {
		panic("policy: encoding rules: " + err.Error()) // strings and structs only
	}
	return data
}

func (r rules) digest() string {
	sum := sha256.Sum256(r.canonical())
	return "sha256:" + hex.EncodeToString(sum[:])
}

// summary returns one line per dimension.
func (r rules) summary() []string {
	line := func(name string, l listRules) string {
		var parts []string
		if len(l.Allow) > 0 {
			parts = append(parts, "allow "+strings.Join(l.Allow, ", "))
		}
		if len(l.Deny) > 0 {
			parts = append(parts, "deny "+strings.Join(l.Deny, ", "))
		}
		if len(parts) == 0 {
			return name + ": unrestricted"
		}
		return name + ": " + strings.Join(parts, "; ")
	}
	paths := line("paths", listRules{Allow: r.Paths.Allow, Deny: r.Paths.Deny})
	if !r.Paths.Read.empty() {
		paths += "; " + line("read", r.Paths.Read)
	}
	if !r.Paths.Write.empty() {
		paths += "; " + line("write", r.Paths.Write)
	}
	if r.Paths.empty() {
		paths = "paths: unrestricted"
	}
	bash := line("bash", listRules{Allow: r.Bash.Allow, Deny: r.Bash.Deny})
	if git := r.Bash.Git.AllowConfig; len(git) > 0 {
		bash += "; git may also run with " + strings.Join(git, ", ")
	}
	out := []string{line("tools", r.Tools), paths, bash, line("skills", r.Skills)}
	for i, c := range r.Callers {
		name := c.Name
		if name == "" {
			name = "callers[" + strconv.Itoa(i) + "]"
		}
		var match []string
		iss := c.Match.Iss
		if implied, err := entryIssuers(c.Match); err == nil && len(iss) == 0 && len(implied) > 0 {
			// Said, as the agent holds the entry to it.
			match = append(match, "iss "+strings.Join(implied, "|")+" (implied by sub)")
		}
		for _, m := range []struct {
			key  string
			pats entries
		}{{"iss", iss}, {"sub", c.Match.Sub}, {"client_id", c.Match.ClientID}, {"groups", c.Match.Groups}} {
			if len(m.pats) > 0 {
				match = append(match, m.key+" "+strings.Join(m.pats, "|"))
			}
		}
		own := rules{Tools: c.Tools, Paths: c.Paths, Bash: bashRules{Allow: c.Bash.Allow, Deny: c.Bash.Deny}}
		what := "the host-wide rules"
		if !own.empty() {
			s := own.summary()
			what = "the host-wide rules and " + strings.Join(s[:3], "; ")
		}
		out = append(out, fmt.Sprintf("callers: %s (%s): %s", name, strings.Join(match, ", "), what))
	}
	if len(r.Callers) > 0 {
		out = append(out, "callers: a caller no entry matches may use nothing")
	}
	return out
}

var (
	unknownFieldRE = regexp.MustCompile(`field (\S+) not found in type policy\.(\w+)`)
	notMapRE       = regexp.MustCompile("cannot unmarshal !!(\\w+)(?: `([^`]*)`)? into policy\\.(\\w+)")
)

// keysOf says which keys each level of the file takes.
var keysOf = map[string]string{
	"rules":       "tools, paths, bash, skills and callers",
	"callerSpec":  "name, match, tools, paths and bash (allow and deny: git's rules are host-wide)",
	"callerMatch": "iss, sub, client_id and groups",
	"listRules":   "allow and deny",
	"bashRules":   "allow, deny and git",
	"gitRules":    "allow_config",
	"pathLists":   "allow, deny, read and write",
}

// describeYAMLError rewrites a YAML decoding error so it says what to fix.
func describeYAMLError(err error) error {
	var te *yaml.TypeError
	var ee *entryError
	if errors.As(err, &ee) {
		return fmt.Errorf("policy file: %s", ee.msg)
	}
	if !errors.As(err, &te) {
		return fmt.Errorf("policy file is not valid YAML or JSON: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, m := range te.Errors {
		if s := unknownFieldRE.FindStringSubmatch(m); s != nil {
			m = m[:strings.Index(m, s[0])] + fmt.Sprintf("unknown key %q; the keys here are %s", s[1], keysOf[s[2]])
		} else if s := notMapRE.FindStringSubmatch(m); s != nil {
			m = m[:strings.Index(m, s[0])] + fmt.Sprintf("a %s where a mapping with keys %s belongs", s[1], keysOf[s[3]])
		}
		msgs = append(msgs, m)
	}
	return fmt.Errorf("policy file: %s", strings.Join(msgs, "; "))
}
