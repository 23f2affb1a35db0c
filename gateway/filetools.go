package gateway

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// This file registers the file tools beyond read, write and edit: list,
// search, delete and move. Like those, the gateway only reads "host" and
// forwards the arguments; the agent checks them against the host policy.

type listIn struct {
	Host  string `json:"host" jsonschema:"the host to list on"`
	Path  string `json:"path,omitempty" jsonschema:"directory; relative paths resolve against the host's working directory, which is the default"`
	Depth int    `json:"depth,omitempty" jsonschema:"levels to show: 1 is the directory's own entries (default 2, at most 10)"`
}

type searchIn struct {
	Host       string `json:"host" jsonschema:"the host to search on"`
	Path       string `json:"path,omitempty" jsonschema:"file or directory to search; relative paths resolve against the host's working directory, which is the default"`
	Query      string `json:"query" jsonschema:"text to find in a line; with regex an RE2 regular expression"`
	Regex      bool   `json:"regex,omitempty" jsonschema:"treat query as an RE2 regular expression, e.g. (?i)todo|fixme"`
	Glob       string `json:"glob,omitempty" jsonschema:"only files whose name matches (*.go, *.{ts,tsx}); a glob with / matches the path relative to path (src/**/*.go)"`
	MaxResults int    `json:"max_results,omitempty" jsonschema:"most matching lines to show (default 100, at most 1000)"`
}

type deleteIn struct {
	Host           string `json:"host" jsonschema:"the host to delete on"`
	Path           string `json:"path" jsonschema:"file, symbolic link or directory to delete"`
	Recursive      bool   `json:"recursive,omitempty" jsonschema:"required to delete a directory and everything in it"`
	ExpectedSHA256 string `json:"expected_sha256,omitempty" jsonschema:"the file's SHA-256 as you last read it; the delete fails if the file has changed since"`
}

type moveIn struct {
	Host           string `json:"host" jsonschema:"the host to move on"`
	Path           string `json:"path" jsonschema:"file, symbolic link or directory to move"`
	Destination    string `json:"destination" jsonschema:"the full new path, which must not exist (not a directory to move into); missing parent directories are created"`
	ExpectedSHA256 string `json:"expected_sha256,omitempty" jsonschema:"the file's SHA-256 as you last read it; the move fails if the file has changed since"`
}

const (
	descList = "List a directory tree on a host: each entry's path relative to the directory, its type (file, dir, symlink with its target, other) and size. " +
		"depth bounds how deep it goes (default 2, at most 10). At most 1000 entries, shallow levels first; a note says when the listing was cut and which directories were not expanded. " +
		"Symbolic links are shown, never followed. Entries the host's path policy does not let you read are left out and counted. " +
		"Use this rather than bash ls or find: it is checked against the host's path policy, which bash commands are not."
	descSearch = "Search the lines of text files on a host for query (literal text, or an RE2 regular expression with regex: true) in one file or every file below a directory. " +
		"Output is path:line: text, at most max_results lines (default 100, at most 1000) and 50KB, each line cut to 300 characters around the match; a note says when more matches remain and what was skipped. " +
		"glob filters file names. Binary files, files over 10MB, symbolic links and .git/.hg/.svn directories are skipped; at most 50000 entries are examined, for at most 20 s. " +
		"Use this rather than bash grep: every file it opens is checked against the host's path policy, which bash commands are not."
	descDelete = "Delete a file or a symbolic link (the link itself, never what it points to) on a host. " +
		"A directory only with recursive: true, and only if the host's path policy lets you write it and every entry below it: all are checked before anything is deleted (at most 100000 entries; never across a mount point). " +
		"The agent's own files and working directory are refused. expected_sha256 makes it fail if the file has changed. " +
		"Use this rather than bash rm: it is checked against the host's path policy, which bash commands are not."
	descMove = "Move or rename a file, symbolic link or directory on a host. destination is the full new path and must not exist: move never replaces anything. " +
		"It renames within one file system and never copies (across file systems, read and write the file, then delete it). " +
		"The host's path policy must let you read and write path and write destination, for a directory every entry below it. expected_sha256 makes it fail if the file has changed. " +
		"Use this rather than bash mv: both paths are checked against the host's path policy, which bash commands are not."
)

// addFileTools registers list, search, delete and move.
func (g *Gateway) addFileTools(s *mcp.Server) {
	destructive := true
	mcp.AddTool(s, &mcp.Tool{Name: "list", Description: descList, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, in listIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, "list", g.cfg.FileCallTimeout), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "search", Description: descSearch, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest, in searchIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, "search", g.cfg.FileCallTimeout), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "delete", Description: descDelete, Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive}},
		func(ctx context.Context, req *mcp.CallToolRequest, in deleteIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, "delete", g.cfg.FileCallTimeout), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "move", Description: descMove},
		func(ctx context.Context, req *mcp.CallToolRequest, in moveIn) (*mcp.CallToolResult, any, error) {
			return g.forward(ctx, req, in.Host, "move", g.cfg.FileCallTimeout), nil, nil
		})
}
