package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway/access"
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
// The skills are the bundles the gateway serves (a skills.Source, through
// a skills.Catalog, which builds the entries and checks every file), the
// same for every caller who may see them: a caller sees them when its
// access rules grant it the skill tool on at least one host; to any
// other caller skills/list is empty and every skill is unknown.

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

type listSkillsParams struct {
	mcp.ParamsBase
	Cursor string `json:"cursor,omitempty"`
}

type listSkillsResult struct {
	mcp.ResultBase
	ResultType string         `json:"resultType"`
	Skills     []skills.Entry `json:"skills"`
	NextCursor string         `json:"nextCursor,omitempty"`
	TTLMs      int            `json:"ttlMs"`
	CacheScope string         `json:"cacheScope"`
}

type getSkillParams struct {
	mcp.ParamsBase
	URI string `json:"uri"`
}

type getSkillResult struct {
	mcp.ResultBase
	ResultType string       `json:"resultType"`
	Skill      skills.Entry `json:"skill"`
	TTLMs      int          `json:"ttlMs"`
	CacheScope string       `json:"cacheScope"`
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
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: skills.URIScheme + "{skill}/{+path}", Name: "skill-file",
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
			if r.Params != nil && strings.HasPrefix(r.Params.URI, skills.URIScheme) {
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
func (g *Gateway) skillsVisible(id *access.Identity) bool {
	gr := g.subsys.access.Load().For(id)
	return slices.ContainsFunc(g.calling.reg.list(""), func(h HostInfo) bool {
		return gr.Tool(protocol.ToolSkill, h.Host, h.Labels).Allowed
	})
}

func (g *Gateway) listSkills(ctx context.Context, _ *mcp.ServerSession, p *listSkillsParams) (*listSkillsResult, error) {
	res := &listSkillsResult{ResultType: resultComplete, Skills: []skills.Entry{}, TTLMs: skillsTTLMs, CacheScope: skillsCacheScope}
	after := ""
	if p != nil && p.Cursor != "" {
		var err error
		if after, err = skills.DecodeCursor(p.Cursor); err != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
		}
	}
	id, _ := ctx.Value(skillsCaller{}).(*access.Identity)
	if !g.skillsVisible(id) {
		return res, nil
	}
	served, err := g.serving.skills.Served(ctx)
	if err != nil {
		return nil, err
	}
	last := ""
	for _, sm := range served {
		if sm.Manifest.Name <= after {
			continue
		}
		if len(res.Skills) == skillsPageSize {
			res.NextCursor = skills.EncodeCursor(last)
			break
		}
		entry, err := g.serving.skills.Entry(ctx, sm)
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
	name, file, err := skills.ParseURI(p.URI)
	if err == nil && file != skills.SkillMDPath {
		err = fmt.Errorf("%s is a file of skill %s, not its SKILL.md: ask for %s", skills.ClipURI(p.URI), name, skills.MDURI(name))
	}
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
	}
	id, _ := ctx.Value(skillsCaller{}).(*access.Identity)
	sm, ok, err := g.servedSkill(ctx, id, name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "no skill is served at " + p.URI + " (skills/list lists the skills you may use)"}
	}
	entry, err := g.serving.skills.Entry(ctx, sm)
	if err != nil {
		g.log.Warn("skill not served", "skill", name, "bundle", sm.BundleID, "err", err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("skill %s cannot be served: %v", name, err)}
	}
	return &getSkillResult{ResultType: resultComplete, Skill: entry, TTLMs: skillFreshTTLMs, CacheScope: skillsCacheScope}, nil
}

// servedSkill returns the bundle served as skill name, if id may see it.
func (g *Gateway) servedSkill(ctx context.Context, id *access.Identity, name string) (protocol.SignedManifest, bool, error) {
	if !g.skillsVisible(id) {
		return protocol.SignedManifest{}, false, nil
	}
	return g.serving.skills.Lookup(ctx, name)
}

// readSkillFile serves resources/read of a skill:// URI. A file the
// caller may not see answers exactly as one that does not exist.
func (g *Gateway) readSkillFile(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	name, file, err := skills.ParseURI(uri)
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
	if err := skills.CheckManifest(sm); err != nil {
		g.log.Warn("skill not served", "skill", name, "bundle", sm.BundleID, "err", err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("skill %s cannot be served: %v", name, err)}
	}
	i := slices.IndexFunc(sm.Manifest.Files, func(f protocol.BundleFile) bool { return f.Path == file })
	if i < 0 {
		return nil, resourceError(uri, fmt.Sprintf("skill %s has no file %q (skills/get %s lists its files)", name, file, skills.MDURI(name)))
	}
	f := sm.Manifest.Files[i]
	data, err := g.serving.skills.File(ctx, f)
	if err != nil {
		g.log.Warn("skill file not served", "skill", name, "path", file, "sha256", f.SHA256, "err", err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("skill %s: %s cannot be served: %v", name, file, err)}
	}
	c := &mcp.ResourceContents{URI: uri, MIMEType: skills.FileMIME(file, data)}
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
	served, err := g.serving.skills.Served(ctx)
	if err != nil {
		return nil, err
	}
	resources := slices.Clone(list.Resources)
	for _, sm := range served {
		entry, err := g.serving.skills.Entry(ctx, sm)
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
func skillResources(m protocol.Manifest, entry skills.Entry) []*mcp.Resource {
	out := make([]*mcp.Resource, 0, len(m.Files))
	for _, f := range m.Files {
		mime, _ := skills.MIMEByExt(f.Path)
		r := &mcp.Resource{URI: skills.FileURI(m.Name, f.Path), Name: m.Name + "/" + f.Path, Size: f.Size, MIMEType: mime}
		if f.Path == skills.SkillMDPath {
			r.Name = m.Name
			r.Description, _ = entry.Frontmatter["description"].(string)
		}
		out = append(out, r)
	}
	return out
}
