package gateway

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/skills"
)

// resources/directory/read of the MCP Skills extension: the direct
// children of a skill's folder (skill://NAME) or of a folder in it
// (skill://NAME/PATH), files with their resource metadata and folders as
// inode/directory resources.

const (
	methodDirectoryRead = "resources/directory/read"
	mimeDirectory       = "inode/directory"
)

type readDirectoryParams struct {
	mcp.ParamsBase
	URI    string `json:"uri"`
	Cursor string `json:"cursor,omitempty"`
}

type readDirectoryResult struct {
	mcp.ResultBase
	ResultType string          `json:"resultType"`
	Resources  []*mcp.Resource `json:"resources"`
}

func (g *Gateway) readSkillDirectory(ctx context.Context, _ *mcp.ServerSession, p *readDirectoryParams) (*readDirectoryResult, error) {
	invalid := func(msg string) error { return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg} }
	if p == nil || p.URI == "" {
		return nil, invalid("resources/directory/read needs params.uri, e.g. skill://NAME or skill://NAME/FOLDER")
	}
	if p.Cursor != "" {
		return nil, invalid("invalid cursor: a skill folder is listed in one page")
	}
	name, dir, err := skills.ParseDirURI(p.URI)
	if err != nil {
		return nil, invalid(err.Error())
	}
	id, _ := ctx.Value(skillsCaller{}).(*access.Identity)
	sm, ok, err := g.servedSkill(ctx, id, name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, invalid("no directory is served at " + p.URI + " (skills/list lists the skills you may use)")
	}
	if err := skills.CheckManifest(sm); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("skill %s cannot be served: %v", name, err)}
	}
	children := dirChildren(sm.Manifest, dir)
	if len(children) == 0 {
		return nil, invalid(p.URI + " is not a directory resource (skills/get " + skills.MDURI(name) + " lists the skill's files)")
	}
	return &readDirectoryResult{ResultType: resultComplete, Resources: children}, nil
}

// dirChildren lists the direct children of folder dir of a bundle, in
// path order; none when dir is not a folder of it.
func dirChildren(m protocol.Manifest, dir string) []*mcp.Resource {
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	var out []*mcp.Resource
	seen := map[string]bool{}
	for _, f := range m.Files {
		rel, ok := strings.CutPrefix(f.Path, prefix)
		if !ok {
			continue
		}
		child, _, isDir := strings.Cut(rel, "/")
		if seen[child] {
			continue
		}
		seen[child] = true
		if isDir {
			out = append(out, &mcp.Resource{URI: skills.DirURI(m.Name, prefix+child), Name: child, MIMEType: mimeDirectory})
			continue
		}
		mime, _ := skills.MIMEByExt(f.Path)
		out = append(out, &mcp.Resource{URI: skills.FileURI(m.Name, f.Path), Name: path.Base(f.Path), MIMEType: mime, Size: f.Size})
	}
	return out
}
