package protocol

import "encoding/json"

// The arguments of the per-host tools, one struct per tool: the gateway
// publishes each as the tool's input schema (field names from the json
// tags, descriptions from the jsonschema tags, with {{limit}} names
// expanded by Describe; a field without omitempty is required), and the
// agent decodes the caller's arguments into it, refusing fields it does
// not have. Adding an argument is adding a field here and using it in the
// agent's tool.
//
// Optional fields whose zero value is a valid choice different from the
// default are pointers: nil means "not given". A JSON null is the same as
// leaving a field out.

// OnHost is the argument every per-host tool takes first: the host the
// call is for. The gateway routes the call by it; the agent ignores it,
// since the call itself says which host it is for.
type OnHost struct {
	Host string `json:"host" jsonschema:"the host to use: one of the names hosts lists"`
}

// TargetHost returns the host the call is for.
func (h OnHost) TargetHost() string { return h.Host }

// ReadArgs are the arguments of read.
type ReadArgs struct {
	OnHost
	Path   string `json:"path" jsonschema:"file path; relative paths resolve against the host's working directory"`
	Offset int    `json:"offset,omitempty" jsonschema:"first line to read, 1-based"`
	Limit  int    `json:"limit,omitempty" jsonschema:"maximum number of lines to read"`
	// BinaryBase64 skips the text and image handling altogether.
	BinaryBase64 bool   `json:"binary_base64,omitempty" jsonschema:"return the file's raw bytes base64-encoded, unprocessed, whatever the file is (up to {{binary_max}} unless the host sets otherwise)"`
	Anchor       string `json:"anchor,omitempty" jsonschema:"instead of offset/limit: exact text that occurs exactly once in the file (may span lines; \\n also matches \\r\\n, at most {{anchor_max_bytes}} and {{anchor_max_lines}} lines); shows the lines around it"`
	// Context is nil when not given: 0 asks for the anchor's lines only.
	Context *int `json:"context,omitempty" jsonschema:"with anchor: lines to show before and after it (default {{anchor_context}}, at most {{anchor_max_context}})"`
}

// WriteArgs are the arguments of write.
type WriteArgs struct {
	OnHost
	Path    string `json:"path" jsonschema:"file path; parent directories are created"`
	Content string `json:"content" jsonschema:"the complete new file content"`
	// Overwrite is nil when not given, which means true.
	Overwrite      *bool  `json:"overwrite,omitempty" jsonschema:"default true; false: only create the file, and fail if it exists"`
	ExpectedSHA256 string `json:"expected_sha256,omitempty" jsonschema:"replace the file only if its current sha256 (from read) is this; otherwise nothing is written"`
}

// EditOp is one replacement of an edit call.
type EditOp struct {
	OldString  string `json:"old_string" jsonschema:"exact text to replace; must match exactly once unless replace_all"`
	NewString  string `json:"new_string" jsonschema:"replacement text"`
	ReplaceAll bool   `json:"replace_all,omitempty" jsonschema:"replace every occurrence"`
}

// EditArgs are the arguments of edit.
type EditArgs struct {
	OnHost
	Path           string   `json:"path" jsonschema:"file path"`
	Edits          []EditOp `json:"edits" jsonschema:"edits applied in order, each to the result of the previous"`
	ExpectedSHA256 string   `json:"expected_sha256,omitempty" jsonschema:"edit only if the file's current sha256 (from read or a previous edit) is this; otherwise nothing changes"`
}

// BashArgs are the arguments of bash.
type BashArgs struct {
	OnHost
	Command string `json:"command" jsonschema:"the command line in the host's shell (see hosts): bash on Linux and macOS, a PowerShell script on Windows"`
	// Timeout is nil when not given: the host's default applies.
	Timeout    *float64 `json:"timeout,omitempty" jsonschema:"seconds before the command is killed with its process group: default {{bash_timeout}}, at most {{bash_max_timeout}}; with background, default {{task_timeout_s}}, at most {{task_max_timeout_s}} (host defaults; a host may configure others)"`
	Background bool     `json:"background,omitempty" jsonschema:"start the command as a background task and return its task_id at once; follow it with task_status"`
	Cwd        string   `json:"cwd,omitempty" jsonschema:"directory to run in (default: the host's working directory; relative paths resolve there); it must be a directory the host's policy lets the tools read; at most {{cwd_max}} bytes"`
	// Parameters keep their values' JSON as the caller wrote it: they are
	// handed to PowerShell as they are.
	Parameters map[string]json.RawMessage `json:"parameters,omitempty" jsonschema:"PowerShell hosts only: named script parameters, bound by name to the script's param() block as values (never pasted into the script text): at most {{params_max}}, names of letters, digits and _, values any JSON, {{params_max_bytes}} in all"`
}

// SkillArgs are the arguments of skill.
type SkillArgs struct {
	OnHost
	Name string `json:"name" jsonschema:"the skill's name, as listed in resource://skills"`
}

// ListArgs are the arguments of list.
type ListArgs struct {
	OnHost
	Path  string `json:"path,omitempty" jsonschema:"directory; relative paths resolve against the host's working directory, which is the default"`
	Depth int    `json:"depth,omitempty" jsonschema:"levels to show: 1 is the directory's own entries (default {{list_depth}}, at most {{list_max_depth}})"`
}

// SearchArgs are the arguments of search.
type SearchArgs struct {
	OnHost
	Path       string `json:"path,omitempty" jsonschema:"file or directory to search; relative paths resolve against the host's working directory, which is the default"`
	Query      string `json:"query" jsonschema:"text to find in a line; with regex an RE2 regular expression"`
	Regex      bool   `json:"regex,omitempty" jsonschema:"treat query as an RE2 regular expression, e.g. (?i)todo|fixme"`
	Glob       string `json:"glob,omitempty" jsonschema:"only files whose name matches (*.go, *.{ts,tsx}); a glob with / matches the path relative to path (src/**/*.go)"`
	MaxResults int    `json:"max_results,omitempty" jsonschema:"most matching lines to show (default {{search_results}}, at most {{search_max_results}})"`
}

// DeleteArgs are the arguments of delete.
type DeleteArgs struct {
	OnHost
	Path           string `json:"path" jsonschema:"file, symbolic link or directory to delete"`
	Recursive      bool   `json:"recursive,omitempty" jsonschema:"required to delete a directory and everything in it"`
	ExpectedSHA256 string `json:"expected_sha256,omitempty" jsonschema:"the file's SHA-256 as you last read it; the delete fails if the file has changed since"`
}

// MoveArgs are the arguments of move.
type MoveArgs struct {
	OnHost
	Path           string `json:"path" jsonschema:"file, symbolic link or directory to move"`
	Destination    string `json:"destination" jsonschema:"the full new path, which must not exist (not a directory to move into); missing parent directories are created"`
	ExpectedSHA256 string `json:"expected_sha256,omitempty" jsonschema:"the file's SHA-256 as you last read it; the move fails if the file has changed since"`
}

// PatchArgs are the arguments of patch.
type PatchArgs struct {
	OnHost
	Patch  string `json:"patch" jsonschema:"a unified diff of one or more files (git diff or diff -u output): ---/+++ headers, @@ hunks; /dev/null creates or deletes a file"`
	DryRun bool   `json:"dry_run,omitempty" jsonschema:"check the patch and report per hunk where it would apply, writing nothing"`
}

// TaskStatusArgs are the arguments of task_status.
type TaskStatusArgs struct {
	OnHost
	TaskID string `json:"task_id" jsonschema:"the task's ID, as bash with background: true or task_list returned it"`
	// Wait is nil when not given: 0 answers at once.
	Wait *float64 `json:"wait,omitempty" jsonschema:"seconds to wait for the task to end: default {{task_wait}}, at most {{task_max_wait}}; 0 answers at once"`
}

// TaskCancelArgs are the arguments of task_cancel.
type TaskCancelArgs struct {
	OnHost
	TaskID string `json:"task_id" jsonschema:"the task's ID"`
}

// TaskListArgs are the arguments of task_list.
type TaskListArgs struct {
	OnHost
	State string `json:"state,omitempty" jsonschema:"only tasks in this state: queued, running, succeeded, failed, timed_out, cancelled or lost"`
	// Limit is nil when not given, so that 0 is refused rather than read
	// as the default.
	Limit *int `json:"limit,omitempty" jsonschema:"at most this many tasks, newest first: default {{task_list}}, at most {{task_max_list}}"`
}
