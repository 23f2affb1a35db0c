package gateway

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

const skillScheme = "skill://"

// skillFileURI is the URI of the file at path (a bundle path) of skill
// name.
func skillFileURI(name, path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return skillScheme + name + "/" + strings.Join(parts, "/")
}

// skillMDURI is the URI of a skill's SKILL.md, by which skills/get names
// the skill.
func skillMDURI(name string) string { return skillFileURI(name, skillMDFile) }

const skillMDFile = "SKILL.md"

// parseSkillURI splits a skill:// URI into the skill's name and the
// file's bundle path, refusing anything that is not the canonical URI of
// a valid bundle path.
func parseSkillURI(uri string) (name, path string, err error) {
	rest, ok := strings.CutPrefix(uri, skillScheme)
	if !ok {
		return "", "", fmt.Errorf("%q is not a skill:// URI: use skill://NAME/SKILL.md (skills/list gives every URI)", clipURI(uri))
	}
	name, encoded, ok := strings.Cut(rest, "/")
	if err := protocol.ValidateSkillName(name); err != nil {
		return "", "", fmt.Errorf("%q does not name a skill: %w", clipURI(uri), err)
	}
	if !ok || encoded == "" {
		return "", "", fmt.Errorf("%q names no file: a skill's files are skill://%s/PATH, its entry skill://%s/SKILL.md", clipURI(uri), name, name)
	}
	parts := strings.Split(encoded, "/")
	for i, p := range parts {
		if parts[i], err = url.PathUnescape(p); err != nil {
			return "", "", fmt.Errorf("%q has a bad percent-encoding: %w", clipURI(uri), err)
		}
	}
	path = strings.Join(parts, "/")
	if err := protocol.CheckBundlePath(path); err != nil {
		return "", "", fmt.Errorf("%q names no file of a skill: %w", clipURI(uri), err)
	}
	if canonical := skillFileURI(name, path); canonical != uri {
		return "", "", fmt.Errorf("%q is not spelled as the gateway spells it: use %s", clipURI(uri), canonical)
	}
	return name, path, nil
}

// clipURI shortens a URI for an error message.
func clipURI(uri string) string {
	if len(uri) > 200 {
		return uri[:200] + "..."
	}
	return uri
}

// skills/list pages are cursored by the last skill name served: the
// cursor is opaque to clients (base64url of "v1:" and the name).
const skillCursorPrefix = "v1:"

func encodeSkillCursor(lastName string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(skillCursorPrefix + lastName))
}

// decodeSkillCursor returns the name after which the next page starts.
func decodeSkillCursor(cursor string) (string, error) {
	bad := errors.New("invalid cursor: pass back the nextCursor of the previous skills/list page, or none for the first page")
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return "", bad
	}
	name, ok := strings.CutPrefix(string(raw), skillCursorPrefix)
	if !ok || protocol.ValidateSkillName(name) != nil {
		return "", bad
	}
	return name, nil
}
