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

// skillDirURI is the URI of folder dir ("" for the root) of skill name:
// no trailing slash.
func skillDirURI(name, dir string) string {
	if dir == "" {
		return skillScheme + name
	}
	return skillFileURI(name, dir)
}

// parseSkillDirURI splits a directory URI into the skill's name and the
// folder's path in the bundle ("" for the root).
func parseSkillDirURI(uri string) (name, dir string, err error) {
	if rest, ok := strings.CutPrefix(uri, skillScheme); ok && !strings.Contains(rest, "/") {
		if err := protocol.ValidateSkillName(rest); err != nil {
			return "", "", fmt.Errorf("%q does not name a skill: %w", clipURI(uri), err)
		}
		return rest, "", nil
	}
	return parseSkillURI(uri)
}

func (g *Gateway) readSkillDirectory(ctx context.Context, _ *mcp.ServerSession, p *readDirectoryParams) (*readDirectoryResult, error) {
	invalid := func(msg string) error { return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg} }
	if p == nil || p.URI == "" {
		return nil, invalid("resources/directory/read needs params.uri, e.g. skill://NAME or skill://NAME/FOLDER")
	}
	if p.Cursor != "" {
		return nil, invalid("invalid cursor: a skill folder is listed in one page")
	}
	name, dir, err := parseSkillDirURI(p.URI)
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
	if err := checkManifest(sm); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("skill %s cannot be served: %v", name, err)}
	}
	children := dirChildren(sm.Manifest, dir)
	if len(children) == 0 {
		return nil, invalid(p.URI + " is not a directory resource (skills/get " + skillMDURI(name) + " lists the skill's files)")
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
			out = append(out, &mcp.Resource{URI: skillDirURI(m.Name, prefix+child), Name: child, MIMEType: mimeDirectory})
			continue
		}
		mime, _ := mimeByExt(f.Path)
		out = append(out, &mcp.Resource{URI: skillFileURI(m.Name, f.Path), Name: path.Base(f.Path), MIMEType: mime, Size: f.Size})
	}
	return out
}
