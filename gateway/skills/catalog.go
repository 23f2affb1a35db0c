package skills

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file is the catalog the gateway's MCP Skills extension serves
// from a Source: a Skill entry for each served bundle (the SKILL.md
// frontmatter as a JSON object, every file with its sha256 digest and
// size), and the files themselves. Every file is checked against its
// manifest's digest and size before it is served or parsed: a store that
// returns wrong bytes gets an error, never the bytes.

const (
	mimeJSON     = "application/json"
	mimeText     = "text/plain"
	mimeMarkdown = "text/markdown"
)

// EntryFile is a SkillResource of the MCP Skills extension: one file of
// a skill.
type EntryFile struct {
	URI    string `json:"uri"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// Entry is a Skill entry of the MCP Skills extension, as skills/list
// and skills/get answer it.
type Entry struct {
	URI         string         `json:"uri"`
	Frontmatter map[string]any `json:"frontmatter"`
	Resources   []EntryFile    `json:"resources"`
}

// Catalog serves a Source's skills as the extension's entries and files.
type Catalog struct {
	src Source

	// frontmatter caches the parsed frontmatter of SKILL.md files by
	// digest (a digest names the same bytes forever).
	mu          sync.Mutex
	frontmatter map[string]map[string]any
}

// maxFrontmatterCache bounds the frontmatter cache; it is emptied when
// full.
const maxFrontmatterCache = 4096

// NewCatalog returns the catalog of src's skills.
func NewCatalog(src Source) *Catalog {
	return &Catalog{src: src, frontmatter: map[string]map[string]any{}}
}

// Lookup returns the bundle src serves as skill name.
func (ss *Catalog) Lookup(ctx context.Context, name string) (protocol.SignedManifest, bool, error) {
	sm, ok, err := ss.src.ServedSkill(ctx, name)
	if err != nil {
		return sm, false, fmt.Errorf("look up skill %s: %w", name, err)
	}
	return sm, ok && sm.Manifest.Name == name, nil
}

// Served returns the served bundles sorted by skill name, one per name.
func (ss *Catalog) Served(ctx context.Context) ([]protocol.SignedManifest, error) {
	served, err := ss.src.ServedSkills(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the served skills: %w", err)
	}
	// A copy: the source may hand out a slice it keeps.
	served = slices.Clone(served)
	slices.SortStableFunc(served, func(a, b protocol.SignedManifest) int { return strings.Compare(a.Manifest.Name, b.Manifest.Name) })
	return slices.CompactFunc(served, func(a, b protocol.SignedManifest) bool { return a.Manifest.Name == b.Manifest.Name }), nil
}

// Entry builds the Skill entry of a served bundle.
func (ss *Catalog) Entry(ctx context.Context, sm protocol.SignedManifest) (Entry, error) {
	if err := CheckManifest(sm); err != nil {
		return Entry{}, err
	}
	m := sm.Manifest
	i := slices.IndexFunc(m.Files, func(f protocol.BundleFile) bool { return f.Path == SkillMDPath })
	fm, err := ss.skillFrontmatter(ctx, m.Name, m.Files[i])
	if err != nil {
		return Entry{}, err
	}
	files := make([]EntryFile, len(m.Files))
	for i, f := range m.Files {
		files[i] = EntryFile{URI: FileURI(m.Name, f.Path), Digest: "sha256:" + f.SHA256, Size: f.Size}
	}
	return Entry{URI: MDURI(m.Name), Frontmatter: fm, Resources: files}, nil
}

// CheckManifest checks a served bundle as an agent would before serving
// any of it: a valid manifest whose ID is the one it is served under.
func CheckManifest(sm protocol.SignedManifest) error {
	if err := sm.Manifest.Validate(); err != nil {
		return fmt.Errorf("invalid manifest: %w", err)
	}
	if id := sm.Manifest.BundleID(); id != sm.BundleID {
		return fmt.Errorf("the manifest's bundle ID is %s, not %s as stored", id, sm.BundleID)
	}
	return nil
}

// File returns the contents of f from the source, checked against f's
// size and digest.
func (ss *Catalog) File(ctx context.Context, f protocol.BundleFile) ([]byte, error) {
	data, err := ss.src.SkillFile(ctx, f.SHA256)
	if err != nil {
		return nil, fmt.Errorf("read file %s: %w", f.SHA256, err)
	}
	sum := sha256.Sum256(data)
	if int64(len(data)) != f.Size || hex.EncodeToString(sum[:]) != f.SHA256 {
		return nil, fmt.Errorf("the skill store returned %d bytes for %s (%d bytes, sha256 %s) that do not match it: the store is damaged", len(data), f.Path, f.Size, f.SHA256)
	}
	return data, nil
}

// skillFrontmatter returns the frontmatter of the SKILL.md f of skill
// name, checked as the extension requires: name equal to the skill's,
// a description.
func (ss *Catalog) skillFrontmatter(ctx context.Context, name string, f protocol.BundleFile) (map[string]any, error) {
	ss.mu.Lock()
	fm, ok := ss.frontmatter[f.SHA256]
	ss.mu.Unlock()
	if !ok {
		data, err := ss.File(ctx, f)
		if err != nil {
			return nil, err
		}
		if fm, err = parseFrontmatter(data); err != nil {
			return nil, err
		}
		ss.mu.Lock()
		if len(ss.frontmatter) >= maxFrontmatterCache {
			clear(ss.frontmatter)
		}
		ss.frontmatter[f.SHA256] = fm
		ss.mu.Unlock()
	}
	if n, _ := fm["name"].(string); n != name {
		return nil, fmt.Errorf("SKILL.md names the skill %q, not %q", n, name)
	}
	if d, _ := fm["description"].(string); strings.TrimSpace(d) == "" {
		return nil, errors.New("SKILL.md has no description")
	}
	return fm, nil
}

// parseFrontmatter returns the YAML frontmatter of a SKILL.md as a JSON
// object, every field as the author wrote it. It finds the block as the
// agent's catalog does: a first line "---" (after an optional BOM), up
// to the next "---" line.
func parseFrontmatter(data []byte) (map[string]any, error) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf"))
	first, rest, _ := bytes.Cut(data, []byte("\n"))
	if string(bytes.TrimRight(first, " \t\r")) != "---" {
		return nil, errors.New(`SKILL.md does not start with YAML frontmatter: its first line must be "---"`)
	}
	end := -1
	for off := 0; off < len(rest); {
		line, _, _ := bytes.Cut(rest[off:], []byte("\n"))
		if string(bytes.TrimRight(line, " \t\r")) == "---" {
			end = off
			break
		}
		off += len(line) + 1
	}
	if end < 0 {
		return nil, errors.New(`SKILL.md frontmatter is not closed: add a "---" line after it`)
	}
	var doc any
	if err := yaml.Unmarshal(rest[:end], &doc); err != nil {
		return nil, fmt.Errorf("SKILL.md frontmatter is not valid YAML: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	v, err := jsonValue(doc)
	if err != nil {
		return nil, fmt.Errorf("SKILL.md frontmatter: %w", err)
	}
	fm, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("SKILL.md frontmatter is not a YAML mapping of fields")
	}
	return fm, nil
}

// jsonValue converts a decoded YAML value into its JSON form: mappings
// with non-string keys get their keys as text, timestamps are text, and
// floats JSON cannot carry are refused.
func jsonValue(v any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			out[k] = c
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			out[fmt.Sprint(k)] = c
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			c, err := jsonValue(e)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("the value %v has no JSON form", x)
		}
	case time.Time:
		// An unquoted date: as written when it is a plain date, else
		// in RFC 3339.
		if x.Equal(time.Date(x.Year(), x.Month(), x.Day(), 0, 0, 0, 0, time.UTC)) && x.Location() == time.UTC {
			return x.Format(time.DateOnly), nil
		}
		return x.Format(time.RFC3339Nano), nil
	}
	return v, nil
}

// FileMIME is the MIME type a skill file is served with: by its
// extension, else text or binary by its contents.
func FileMIME(p string, data []byte) string {
	if mime, ok := MIMEByExt(p); ok {
		return mime
	}
	if !utf8.Valid(data) {
		return "application/octet-stream"
	}
	return mimeText
}

// MIMEByExt is the MIME type of the common file kinds of skills.
func MIMEByExt(p string) (string, bool) {
	mime, ok := skillMIMETypes[strings.ToLower(path.Ext(p))]
	return mime, ok
}

var skillMIMETypes = map[string]string{
	".md": mimeMarkdown, ".markdown": mimeMarkdown, ".txt": mimeText, ".json": mimeJSON,
	".py": "text/x-python", ".sh": "text/x-shellscript", ".js": "text/javascript", ".mjs": "text/javascript",
	".ts": "text/x-typescript", ".html": "text/html", ".css": "text/css", ".csv": "text/csv",
	".yaml": "application/yaml", ".yml": "application/yaml", ".xml": "application/xml",
	".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
	".svg": "image/svg+xml", ".pdf": "application/pdf",
}
