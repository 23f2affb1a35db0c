// Package skillmd reads a SKILL.md's frontmatter by the Agent Skills
// rules. It exists so that agents (for their catalogs) and gateways
// (before they accept a bundle for rollout) judge a skill with one parser:
// a bundle a gateway took is a skill every agent lists as valid.
package skillmd

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Limits of the Agent Skills format.
const (
	MaxDescription   = 1024
	MaxCompatibility = 500
)

// Meta is a SKILL.md's frontmatter.
type Meta struct {
	Name          string            `yaml:"name"`
	Description   string            `yaml:"description"`
	License       string            `yaml:"license"`
	Compatibility string            `yaml:"compatibility"`
	AllowedTools  string            `yaml:"allowed-tools"`
	Metadata      map[string]string `yaml:"metadata"`
}

// skillKeys are the frontmatter keys the format defines.
var skillKeys = []string{"name", "description", "license", "compatibility", "allowed-tools", "metadata"}

// Parse parses the contents of a SKILL.md found in a folder
// called dir (a bundle's skill name). It returns what it could read of
// the frontmatter and, for an invalid skill, an error saying why.
func Parse(dir string, data []byte) (Meta, error) {
	var m Meta
	front, err := frontmatter(data)
	if err != nil {
		return m, err
	}
	var keys map[string]yaml.Node
	if err := yaml.Unmarshal(front, &keys); err != nil {
		return m, fmt.Errorf("frontmatter is not a YAML mapping: %s", yamlProblem(err))
	}
	var unknown []string
	for k := range keys {
		if !slices.Contains(skillKeys, k) {
			unknown = append(unknown, k)
		}
	}
	if err := yaml.Unmarshal(front, &m); err != nil {
		return m, fmt.Errorf("frontmatter: %s", yamlProblem(err))
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return m, fmt.Errorf("frontmatter has unknown key(s) %s; the keys are %s",
			strings.Join(unknown, ", "), strings.Join(skillKeys, ", "))
	}
	return m, validateMeta(dir, m)
}

// frontmatter returns the YAML between the opening "---" line of data and
// the next "---" line.
func frontmatter(data []byte) ([]byte, error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	if string(bytes.TrimRight(first, " \t\r")) != "---" {
		return nil, errors.New(`SKILL.md does not start with YAML frontmatter: its first line must be "---"`)
	}
	for off := 0; off < len(rest); {
		line, _, _ := bytes.Cut(rest[off:], []byte("\n"))
		if string(bytes.TrimRight(line, " \t\r")) == "---" {
			return rest[:off], nil
		}
		off += len(line) + 1
	}
	return nil, errors.New(`SKILL.md frontmatter is not closed: add a "---" line after it`)
}

// yamlProblem shortens a YAML error for a message.
func yamlProblem(err error) string {
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

// validateMeta checks m against the Agent Skills format for a skill
// in a folder called dir.
func validateMeta(dir string, m Meta) error {
	if err := protocol.ValidateSkillName(m.Name); err != nil {
		return err
	}
	if m.Name != dir {
		return fmt.Errorf("name %q differs from its folder name %q; they must be equal", m.Name, dir)
	}
	switch n := utf8.RuneCountInString(m.Description); {
	case strings.TrimSpace(m.Description) == "":
		return errors.New("description is missing or empty; say what the skill does and when to use it")
	case n > MaxDescription:
		return fmt.Errorf("description is %d characters; the limit is %d", n, MaxDescription)
	}
	if n := utf8.RuneCountInString(m.Compatibility); n > MaxCompatibility {
		return fmt.Errorf("compatibility is %d characters; the limit is %d", n, MaxCompatibility)
	}
	return nil
}
