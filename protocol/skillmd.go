package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// A SKILL.md starts with YAML frontmatter that names and describes the
// skill (the Agent Skills format). Agents read it for their catalogs and
// gateways check it before they accept a bundle, with this one parser, so
// a bundle the gateway took is a skill every agent lists as valid.

// Limits of the Agent Skills format.
const (
	MaxSkillDescription   = 1024
	MaxSkillCompatibility = 500
)

// SkillMeta is a SKILL.md's frontmatter.
type SkillMeta struct {
	Name          string            `yaml:"name"`
	Description   string            `yaml:"description"`
	License       string            `yaml:"license"`
	Compatibility string            `yaml:"compatibility"`
	AllowedTools  string            `yaml:"allowed-tools"`
	Metadata      map[string]string `yaml:"metadata"`
}

// skillKeys are the frontmatter keys the format defines.
var skillKeys = []string{"name", "description", "license", "compatibility", "allowed-tools", "metadata"}

// ParseSkillMD parses the contents of a SKILL.md found in a folder
// called dir (a bundle's skill name). It returns what it could read of
// the frontmatter and, for an invalid skill, an error saying why.
func ParseSkillMD(dir string, data []byte) (SkillMeta, error) {
	var m SkillMeta
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
	return m, validateSkillMeta(dir, m)
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

// validateSkillMeta checks m against the Agent Skills format for a skill
// in a folder called dir.
func validateSkillMeta(dir string, m SkillMeta) error {
	if err := ValidateSkillName(m.Name); err != nil {
		return err
	}
	if m.Name != dir {
		return fmt.Errorf("name %q differs from its folder name %q; they must be equal", m.Name, dir)
	}
	switch n := utf8.RuneCountInString(m.Description); {
	case strings.TrimSpace(m.Description) == "":
		return errors.New("description is missing or empty; say what the skill does and when to use it")
	case n > MaxSkillDescription:
		return fmt.Errorf("description is %d characters; the limit is %d", n, MaxSkillDescription)
	}
	if n := utf8.RuneCountInString(m.Compatibility); n > MaxSkillCompatibility {
		return fmt.Errorf("compatibility is %d characters; the limit is %d", n, MaxSkillCompatibility)
	}
	return nil
}
