package skills

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The MCP Skills extension addresses every file of a served skill as
// skill://NAME/PATH: NAME is the skill's name (the URI's authority, a
// valid reg-name since skill names are lowercase letters, digits and
// hyphens) and PATH the file's path in the bundle, each part
// percent-encoded as url.PathEscape does. Only that canonical spelling
// names a file, so one file has one URI.

// URIScheme begins every skill:// URI.
const URIScheme = "skill://"

// FileURI is the URI of the file at path (a bundle path) of skill
// name.
func FileURI(name, path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return URIScheme + name + "/" + strings.Join(parts, "/")
}

// MDURI is the URI of a skill's SKILL.md, by which skills/get names
// the skill.
func MDURI(name string) string { return FileURI(name, SkillMDPath) }

// SkillMDPath is the path of a skill's SKILL.md in its bundle.
const SkillMDPath = "SKILL.md"

// ParseURI splits a skill:// URI into the skill's name and the
// file's bundle path, refusing anything that is not the canonical URI of
// a valid bundle path.
func ParseURI(uri string) (name, path string, err error) {
	rest, ok := strings.CutPrefix(uri, URIScheme)
	if !ok {
		return "", "", fmt.Errorf("%q is not a skill:// URI: use skill://NAME/SKILL.md (skills/list gives every URI)", ClipURI(uri))
	}
	name, encoded, ok := strings.Cut(rest, "/")
	if err := protocol.ValidateSkillName(name); err != nil {
		return "", "", fmt.Errorf("%q does not name a skill: %w", ClipURI(uri), err)
	}
	if !ok || encoded == "" {
		return "", "", fmt.Errorf("%q names no file: a skill's files are skill://%s/PATH, its entry skill://%s/SKILL.md", ClipURI(uri), name, name)
	}
	parts := strings.Split(encoded, "/")
	for i, p := range parts {
		if parts[i], err = url.PathUnescape(p); err != nil {
			return "", "", fmt.Errorf("%q has a bad percent-encoding: %w", ClipURI(uri), err)
		}
	}
	path = strings.Join(parts, "/")
	if err := protocol.CheckBundlePath(path); err != nil {
		return "", "", fmt.Errorf("%q names no file of a skill: %w", ClipURI(uri), err)
	}
	if canonical := FileURI(name, path); canonical != uri {
		return "", "", fmt.Errorf("%q is not spelled as the gateway spells it: use %s", ClipURI(uri), canonical)
	}
	return name, path, nil
}

// DirURI is the URI of folder dir ("" for the root) of skill name:
// no trailing slash.
func DirURI(name, dir string) string {
	if dir == "" {
		return URIScheme + name
	}
	return FileURI(name, dir)
}

// ParseDirURI splits a directory URI into the skill's name and the
// folder's path in the bundle ("" for the root).
func ParseDirURI(uri string) (name, dir string, err error) {
	if rest, ok := strings.CutPrefix(uri, URIScheme); ok && !strings.Contains(rest, "/") {
		if err := protocol.ValidateSkillName(rest); err != nil {
			return "", "", fmt.Errorf("%q does not name a skill: %w", ClipURI(uri), err)
		}
		return rest, "", nil
	}
	return ParseURI(uri)
}

// ClipURI shortens a URI for an error message.
func ClipURI(uri string) string { return protocol.Ellipsis(uri, 200) }

// skills/list pages are cursored by the last skill name served: the
// cursor is opaque to clients (base64url of "v1:" and the name).
const cursorPrefix = "v1:"

// EncodeCursor is the skills/list cursor of the page after lastName.
func EncodeCursor(lastName string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(cursorPrefix + lastName))
}

// DecodeCursor returns the name after which the next page starts.
func DecodeCursor(cursor string) (string, error) {
	bad := errors.New("invalid cursor: pass back the nextCursor of the previous skills/list page, or none for the first page")
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return "", bad
	}
	name, ok := strings.CutPrefix(string(raw), cursorPrefix)
	if !ok || protocol.ValidateSkillName(name) != nil {
		return "", bad
	}
	return name, nil
}
