package gateway

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// patchIn is the input of the patch tool.
type patchIn struct {
	Host   string `json:"host" jsonschema:"the host whose files the patch changes"`
	Patch  string `json:"patch" jsonschema:"a unified diff of one or more files (git diff or diff -u output): ---/+++ headers, @@ hunks; /dev/null creates or deletes a file"`
	DryRun bool   `json:"dry_run,omitempty" jsonschema:"check the patch and report per hunk where it would apply, writing nothing"`
}

const descPatch = "Apply a unified diff (git diff or diff -u format) to one or more files on a host, atomically: if any hunk fails, no file changes and the error lists every failing hunk and why. " +
	"Hunks must match their context and removed lines exactly; a hunk found a few lines away from its stated line applies there (the offset is reported). " +
	"--- /dev/null creates a file (it must not exist), +++ /dev/null deletes one (its content must equal the removed lines). Paths resolve against the host's working directory; a/ and b/ prefixes are stripped. " +
	"CRLF files keep CRLF. Renames, mode changes and binary patches are refused (use move or write). dry_run reports per hunk what would happen without writing. " +
	"At most 16 MiB of patch and 1000 files."

// addPatchTool registers the patch tool, forwarded to the host like write.
func (g *Gateway) addPatchTool(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: toolPatch, Description: descPatch},
		func(ctx context.Context, req *mcp.CallToolRequest, in patchIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, toolPatch, g.cfg.FileCallTimeout), nil, nil
		})
}
