package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.yaml.in/yaml/v3"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/skills"
)

// This file serves the fleet's skills through the MCP Skills extension
// (io.modelcontextprotocol/skills, SEP-2640): the extension declared in
// the server's capabilities, skills/list and skills/get answering Skill
// entries (the SKILL.md frontmatter as a JSON object, every file with its
// sha256 digest and size), each file a skill:// resource read with
// resources/read and listed by resources/list, and each skill folder a
// directory resource read with resources/directory/read (skilldir.go).
//
// The skills are the bundles the gateway serves (skills.Source), the same
// for every caller who may see them: a caller sees them when its access
// rules grant it the skill tool on at least one host; to any other caller
// skills/list is empty and every skill is unknown. Every file is checked
// against its manifest's digest and size before it is served or parsed:
// a store that returns wrong bytes gets an error, never the bytes.

const (
	skillsExtension = "io.modelcontextprotocol/skills"
	methodSkillList = "skills/list"
	methodSkillGet  = "skills/get"

	// skillsPageSize is how many skills one skills/list page holds; a
	// skill's entry is never split across pages.
	skillsPageSize = 50
	// skillsTTLMs is how long a client may keep a skills/list page: a
	// rollout changes what is served. skills/get and file reads are
	// never kept (0): they are how a client that found a file changed
	// catches up, and a kept answer would keep it stale.
	skillsTTLMs     = 60_000
	skillFreshTTLMs = 0
	// Results depend on the caller's access.
	skillsCacheScope = "private"
	resultComplete   = "complete"
)

// mcpSkillFile is a SkillResource: one file of a skill.
type mcpSkillFile struct {
	URI    string `json:"uri"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

// mcpSkill is a Skill entry, as skills/list and skills/get answer it.
type mcpSkill struct {
	URI         string         `json:"uri"`
	Frontmatter map[string]any `json:"frontmatter"`
	Resources   []mcpSkillFile `json:"resources"`
}

type listSkillsParams struct {
	mcp.ParamsBase
	Cursor string `json:"cursor,omitempty"`
}

type listSkillsResult struct {
	mcp.ResultBase
	ResultType string     `json:"resultType"`
	Skills     []mcpSkill `json:"skills"`
	NextCursor string     `json:"nextCursor,omitempty"`
	TTLMs      int        `json:"ttlMs"`
	CacheScope string     `json:"cacheScope"`
}

type getSkillParams struct {
	mcp.ParamsBase
	URI string `json:"uri"`
}

type getSkillResult struct {
	mcp.ResultBase
	ResultType string   `json:"resultType"`
	Skill      mcpSkill `json:"skill"`
	TTLMs      int      `json:"ttlMs"`
	CacheScope string   `json:"cacheScope"`
}

// skillServer serves a skills.Source through the extension.
type skillServer struct {
	src skills.Source
	log *slog.Logger

	// frontmatter caches the parsed frontmatter of SKILL.md files by
	// digest (a digest names the same bytes forever).
	mu          sync.Mutex
	frontmatter map[string]map[string]any
}

// maxFrontmatterCache bounds the frontmatter cache; it is emptied when
// full.
const maxFrontmatterCache = 4096

func newSkillServer(src skills.Source, log *slog.Logger) *skillServer {
	return &skillServer{src: src, log: log, frontmatter: map[string]map[string]any{}}
}

// skillsCaller carries the caller of a skills/ request from the
// middleware, which sees the request's auth, to the method handlers,
// which the SDK calls without it.
type skillsCaller struct{}

// addSkills declares the extension on s's options and registers its
// methods and resources. It is called only with a skill source.
func (g *Gateway) addSkills(s *mcp.Server) {
	must := func(err error) {
		if err != nil {
			panic(err) // only a programming error: a standard method's name
		}
	}
	must(mcp.AddReceivingCustomMethod(s, methodSkillList, g.listSkills))
	must(mcp.AddReceivingCustomMethod(s, methodSkillGet, g.getSkill))
	must(mcp.AddReceivingCustomMethod(s, methodDirectoryRead, g.readSkillDirectory))
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: skillScheme + "{skill}/{+path}", Name: "skill-file",
		Description: "A file of one of the fleet's skills, as skills/list and skills/get list them (MCP Skills extension)."},
		g.readSkillFile)
	s.AddReceivingMiddleware(g.skillsMiddleware)
}

// skillsCapabilities are the server capabilities with the extension
// declared (and logging, which the SDK declares by default).
func skillsCapabilities() *mcp.ServerCapabilities {
	//lint:ignore SA1019 2025-era sessions use logging, and the SDK declares it by default: replacing the capabilities must keep it.
	caps := &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}}
	caps.AddExtension(skillsExtension, map[string]any{"directoryRead": true})
	return caps
}

// skillsMiddleware hands skills/ requests their caller, reads skill://
// resources whatever template the SDK would match, and adds the skill
// files to resources/list.
func (g *Gateway) skillsMiddleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case methodSkillList, methodSkillGet, methodDirectoryRead:
			ctx = context.WithValue(ctx, skillsCaller{}, g.identityOf(req.GetExtra()))
			return next(ctx, method, req)
		}
		switch r := req.(type) {
		case *mcp.ReadResourceRequest:
			if r.Params != nil && strings.HasPrefix(r.Params.URI, skillScheme) {
				return g.readSkillFile(ctx, r)
			}
		case *mcp.ListResourcesRequest:
			return g.listSkillResources(ctx, method, r, next)
		}
		return next(ctx, method, req)
	}
}

// skillsVisible reports whether id may see the fleet's skills: its
// access rules grant it the skill tool on at least one host.
func (g *Gateway) skillsVisible(id *Identity) bool {
	gr := g.cfg.Access.For(id)
	return slices.ContainsFunc(g.reg.list(""), func(h HostInfo) bool {
		return gr.Tool(protocol.ToolSkill, h.Host, h.Labels).Allowed
	})
}

func (g *Gateway) listSkills(ctx context.Context, _ *mcp.ServerSession, p *listSkillsParams) (*listSkillsResult, error) {
	res := &listSkillsResult{ResultType: resultComplete, Skills: []mcpSkill{}, TTLMs: skillsTTLMs, CacheScope: skillsCacheScope}
	after := ""
	if p != nil && p.Cursor != "" {
		var err error
		if after, err = decodeSkillCursor(p.Cursor); err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
		}
	}
	id, _ := ctx.Value(skillsCaller{}).(*Identity)
	if !g.skillsVisible(id) {
		return res, nil
	}
	served, err := g.skills.served(ctx)
	if err != nil {
		return nil, err
	}
	last := ""
	for _, sm := range served {
		if sm.Manifest.Name <= after {
			continue
		}
		if len(res.Skills) == skillsPageSize {
			res.NextCursor = encodeSkillCursor(last)
			break
		}
		entry, err := g.skills.entry(ctx, sm)
		if err != nil {
			// One broken bundle does not hide the others.
			g.log.Warn("skill not served", "skill", sm.Manifest.Name, "bundle", sm.BundleID, "err", err)
			continue
		}
		res.Skills = append(res.Skills, entry)
		last = sm.Manifest.Name
	}
	return res, nil
}

func (g *Gateway) getSkill(ctx context.Context, _ *mcp.ServerSession, p *getSkillParams) (*getSkillResult, error) {
	if p == nil || p.URI == "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "skills/get needs params.uri, the URI of a skill's SKILL.md (skill://NAME/SKILL.md)"}
	}
	name, file, err := parseSkillURI(p.URI)
	if err == nil && file != skillMDFile {
		err = fmt.Errorf("%s is a file of skill %s, not its SKILL.md: ask for %s", clipURI(p.URI), name, skillMDURI(name))
	}
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
	}
	id, _ := ctx.Value(skillsCaller{}).(*Identity)
	sm, ok, err := g.servedSkill(ctx, id, name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "no skill is served at " + p.URI + " (skills/list lists the skills you may use)"}
	}
	entry, err := g.skills.entry(ctx, sm)
	if err != nil {
		g.log.Warn("skill not served", "skill", name, "bundle", sm.BundleID, "err", err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("skill %s cannot be served: %v", name, err)}
	}
	return &getSkillResult{ResultType: resultComplete, Skill: entry, TTLMs: skillFreshTTLMs, CacheScope: skillsCacheScope}, nil
}

// servedSkill returns the bundle served as skill name, if id may see it.
func (g *Gateway) servedSkill(ctx context.Context, id *Identity, name string) (protocol.SignedManifest, bool, error) {
	if !g.skillsVisible(id) {
		return protocol.SignedManifest{}, false, nil
	}
	sm, ok, err := g.skills.src.ServedSkill(ctx, name)
	if err != nil {
		return sm, false, fmt.Errorf("look up skill %s: %w", name, err)
	}
	return sm, ok && sm.Manifest.Name == name, nil
}

// readSkillFile serves resources/read of a skill:// URI. A file the
// caller may not see answers exactly as one that does not exist.
func (g *Gateway) readSkillFile(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	name, file, err := parseSkillURI(uri)
	if err != nil {
		return nil, resourceError(uri, err.Error())
	}
	sm, ok, err := g.servedSkill(ctx, g.identityOf(req.Extra), name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, resourceError(uri, "no skill "+name+" is served (skills/list lists the skills you may use)")
	}
	if err := checkManifest(sm); err != nil {
		g.log.Warn("skill not served", "skill", name, "bundle", sm.BundleID, "err", err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("skill %s cannot be served: %v", name, err)}
	}
	i := slices.IndexFunc(sm.Manifest.Files, func(f protocol.BundleFile) bool { return f.Path == file })
	if i < 0 {
		return nil, resourceError(uri, fmt.Sprintf("skill %s has no file %q (skills/get %s lists its files)", name, file, skillMDURI(name)))
	}
	f := sm.Manifest.Files[i]
	data, err := g.skills.file(ctx, f)
	if err != nil {
		g.log.Warn("skill file not served", "skill", name, "path", file, "sha256", f.SHA256, "err", err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("skill %s: %s cannot be served: %v", name, file, err)}
	}
	c := &mcp.ResourceContents{URI: uri, MIMEType: skillFileMIME(file, data)}
	if len(data) > 0 && utf8.Valid(data) {
		c.Text = string(data)
	} else {
		// Binary files, and empty ones (an empty text would be dropped
		// from the JSON), go as base64.
		c.Blob = append([]byte{}, data...)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{c},
		Cacheable: mcp.Cacheable{TTLMs: skillFreshTTLMs, CacheScope: skillsCacheScope}}, nil
}

// listSkillResources adds the files of the skills the caller may see to
// the last page of resources/list.
func (g *Gateway) listSkillResources(ctx context.Context, method string, req *mcp.ListResourcesRequest, next mcp.MethodHandler) (mcp.Result, error) {
	res, err := next(ctx, method, req)
	list, ok := res.(*mcp.ListResourcesResult)
	if err != nil || !ok || list.NextCursor != "" || !g.skillsVisible(g.identityOf(req.Extra)) {
		return res, err
	}
	served, err := g.skills.served(ctx)
	if err != nil {
		return nil, err
	}
	resources := slices.Clone(list.Resources)
	for _, sm := range served {
		entry, err := g.skills.entry(ctx, sm)
		if err != nil {
			g.log.Warn("skill not served", "skill", sm.Manifest.Name, "bundle", sm.BundleID, "err", err)
			continue
		}
		resources = append(resources, skillResources(sm.Manifest, entry)...)
	}
	list.Resources = resources
	list.CacheScope = skillsCacheScope
	return list, nil
}

// skillResources are the resources/list entries of a skill's files: the
// SKILL.md named and described by its frontmatter, as the extension
// says, the other files by their path.
func skillResources(m protocol.Manifest, entry mcpSkill) []*mcp.Resource {
	out := make([]*mcp.Resource, 0, len(m.Files))
	for _, f := range m.Files {
		mime, _ := mimeByExt(f.Path)
		r := &mcp.Resource{URI: skillFileURI(m.Name, f.Path), Name: m.Name + "/" + f.Path, Size: f.Size, MIMEType: mime}
		if f.Path == skillMDFile {
			r.Name = m.Name
			r.Description, _ = entry.Frontmatter["description"].(string)
		}
		out = append(out, r)
	}
	return out
}

// served returns the served bundles sorted by skill name, one per name.
func (ss *skillServer) served(ctx context.Context) ([]protocol.SignedManifest, error) {
	served, err := ss.src.ServedSkills(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the served skills: %w", err)
	}
	// A copy: the source may hand out a slice it keeps.
	served = slices.Clone(served)
	slices.SortStableFunc(served, func(a, b protocol.SignedManifest) int { return strings.Compare(a.Manifest.Name, b.Manifest.Name) })
	return slices.CompactFunc(served, func(a, b protocol.SignedManifest) bool { return a.Manifest.Name == b.Manifest.Name }), nil
}

// entry builds the Skill entry of a served bundle.
func (ss *skillServer) entry(ctx context.Context, sm protocol.SignedManifest) (mcpSkill, error) {
	if err := checkManifest(sm); err != nil {
		return mcpSkill{}, err
	}
	m := sm.Manifest
	i := slices.IndexFunc(m.Files, func(f protocol.BundleFile) bool { return f.Path == skillMDFile })
	fm, err := ss.skillFrontmatter(ctx, m.Name, m.Files[i])
	if err != nil {
		return mcpSkill{}, err
	}
	files := make([]mcpSkillFile, len(m.Files))
	for i, f := range m.Files {
		files[i] = mcpSkillFile{URI: skillFileURI(m.Name, f.Path), Digest: "sha256:" + f.SHA256, Size: f.Size}
	}
	return mcpSkill{URI: skillMDURI(m.Name), Frontmatter: fm, Resources: files}, nil
}

// checkManifest checks a served bundle as an agent would before serving
// any of it: a valid manifest whose ID is the one it is served under.
func checkManifest(sm protocol.SignedManifest) error {
	if err := sm.Manifest.Validate(); err != nil {
		return fmt.Errorf("invalid manifest: %w", err)
	}
	if id := sm.Manifest.BundleID(); id != sm.BundleID {
		return fmt.Errorf("the manifest's bundle ID is %s, not %s as stored", id, sm.BundleID)
	}
	return nil
}

// file returns the contents of f from the source, checked against f's
// size and digest.
func (ss *skillServer) file(ctx context.Context, f protocol.BundleFile) ([]byte, error) {
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
func (ss *skillServer) skillFrontmatter(ctx context.Context, name string, f protocol.BundleFile) (map[string]any, error) {
	ss.mu.Lock()
	fm, ok := ss.frontmatter[f.SHA256]
	ss.mu.Unlock()
	if !ok {
		data, err := ss.file(ctx, f)
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

// skillFileMIME is the MIME type a skill file is served with: by its
// extension, else text or binary by its contents.
func skillFileMIME(p string, data []byte) string {
	if mime, ok := mimeByExt(p); ok {
		return mime
	}
	if !utf8.Valid(data) {
		return "application/octet-stream"
	}
	return mimeText
}

// mimeByExt is the MIME type of the common file kinds of skills.
func mimeByExt(p string) (string, bool) {
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
