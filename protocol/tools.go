package protocol

import (
	"reflect"
	"slices"
	"sync"
)

// The per-host tools: those the gateway forwards to a host's agent, which
// runs them. Each is declared once, here — name, arguments (toolargs.go),
// limits (toollimits.go) and the description a model reads — and both
// sides use the declaration: the gateway publishes it, the agent serves
// it.

// Names of the per-host tools.
const (
	ToolRead       = "read"
	ToolWrite      = "write"
	ToolEdit       = "edit"
	ToolBash       = "bash"
	ToolSkill      = "skill"
	ToolList       = "list"
	ToolSearch     = "search"
	ToolDelete     = "delete"
	ToolMove       = "move"
	ToolPatch      = "patch"
	ToolTaskStatus = "task_status"
	ToolTaskCancel = "task_cancel"
	ToolTaskList   = "task_list"
)

// ToolSpec declares one per-host tool.
type ToolSpec struct {
	Name string
	// Description is the text a model reads, with the limits written in.
	Description string
	// Args is the type of the tool's arguments, a struct that embeds
	// OnHost.
	Args reflect.Type
	// ReadOnly: the tool changes nothing. Destructive: it may delete
	// what it is given.
	ReadOnly, Destructive bool
	// ComesWith names the tool a task tool belongs to (bash): access
	// rules and host policies name only that one, and whoever may use it
	// on a host may use this one there. Empty for the others.
	ComesWith string
}

// HostTools returns the declarations of every per-host tool, in the order
// access rules list them (a copy: the caller may change it).
func HostTools() []ToolSpec { return slices.Clone(hostTools()) }

// hostTools are the declarations, made once: the gateway looks tools up
// for every call, and for every host of a fan-out.
var hostTools = sync.OnceValue(func() []ToolSpec {
	return []ToolSpec{
		{Name: ToolRead, Args: reflect.TypeFor[ReadArgs](), ReadOnly: true, Description: Describe(descRead)},
		{Name: ToolWrite, Args: reflect.TypeFor[WriteArgs](), Description: Describe(descWrite)},
		{Name: ToolEdit, Args: reflect.TypeFor[EditArgs](), Description: Describe(descEdit)},
		{Name: ToolBash, Args: reflect.TypeFor[BashArgs](), Description: Describe(descBash)},
		{Name: ToolTaskStatus, Args: reflect.TypeFor[TaskStatusArgs](), ReadOnly: true, ComesWith: ToolBash, Description: Describe(descTaskStatus)},
		{Name: ToolTaskCancel, Args: reflect.TypeFor[TaskCancelArgs](), ComesWith: ToolBash, Description: Describe(descTaskCancel)},
		{Name: ToolTaskList, Args: reflect.TypeFor[TaskListArgs](), ReadOnly: true, ComesWith: ToolBash, Description: Describe(descTaskList)},
		{Name: ToolSkill, Args: reflect.TypeFor[SkillArgs](), ReadOnly: true, Description: Describe(descSkill)},
		{Name: ToolList, Args: reflect.TypeFor[ListArgs](), ReadOnly: true, Description: Describe(descList)},
		{Name: ToolSearch, Args: reflect.TypeFor[SearchArgs](), ReadOnly: true, Description: Describe(descSearch)},
		{Name: ToolDelete, Args: reflect.TypeFor[DeleteArgs](), Destructive: true, Description: Describe(descDelete)},
		{Name: ToolMove, Args: reflect.TypeFor[MoveArgs](), Description: Describe(descMove)},
		{Name: ToolPatch, Args: reflect.TypeFor[PatchArgs](), Description: Describe(descPatch)},
	}
})

var hostToolsByName = sync.OnceValue(func() map[string]ToolSpec {
	m := make(map[string]ToolSpec)
	for _, t := range hostTools() {
		m[t.Name] = t
	}
	return m
})

// HostTool returns the declaration of the per-host tool name.
func HostTool(name string) (ToolSpec, bool) {
	t, ok := hostToolsByName()[name]
	return t, ok
}

// GrantedTools returns the names of the per-host tools that access rules
// and host policies name: all but those that come with another.
func GrantedTools() []string { return slices.Clone(grantedTools()) }

var grantedTools = sync.OnceValue(func() []string { return toolNames(func(t ToolSpec) bool { return t.ComesWith == "" }) })

// TaskTools returns the names of the tools that come with bash.
func TaskTools() []string { return slices.Clone(taskTools()) }

var taskTools = sync.OnceValue(func() []string { return toolNames(func(t ToolSpec) bool { return t.ComesWith == ToolBash }) })

func toolNames(keep func(ToolSpec) bool) []string {
	var out []string
	for _, t := range hostTools() {
		if keep(t) {
			out = append(out, t.Name)
		}
	}
	return out
}

// The descriptions, with the limits as {{names}} (see Describe).
const (
	descRead = "Read a text file on a host. Output is truncated to {{output_lines}} lines or {{output_bytes}}, whichever comes first; " +
		"when more remains a note says which offset to continue from. Use offset (1-based line) and limit for large files, " +
		"or anchor (text that occurs once) to see the lines around it. " +
		"The structured result has the whole file's sha256 (for expected_sha256 in write and edit), path and total_lines; " +
		"an anchored read also anchor_line and start_line. " +
		"Images (PNG, JPEG, GIF, WebP, BMP, TIFF; told by content, not name) come back as images: scaled to at most {{image_max_px}} px and {{image_max_bytes}} unless the host sets otherwise, " +
		"turned upright per EXIF, with a note giving the original size and how to map coordinates. Other binary files are refused unless binary_base64 is set."
	descWrite = "Write a file on a host, replacing it if it exists. Creates parent directories. " +
		"The write is atomic (temporary file, then rename); an existing file keeps its permissions. " +
		"expected_sha256 replaces only the version you read; overwrite false only creates. The structured result has the new sha256."
	descEdit = "Edit a file on a host by exact string replacement. Each old_string must match exactly once (or set replace_all); " +
		"edits apply in order. If any edit fails nothing is written and the error names the edit. Prefer this over write for changes to existing files. " +
		"CRLF line endings and a UTF-8 BOM are kept: \\n in old_string matches \\r\\n, and line breaks in new_string take the ending of the line where the replaced text starts. " +
		"expected_sha256 edits only the version you read. The structured result has the new sha256."
	descPatch = "Apply a unified diff (git diff or diff -u format) to one or more files on a host, atomically: if any hunk fails, no file changes and the error lists every failing hunk and why. " +
		"Hunks must match their context and removed lines exactly; a hunk found a few lines away from its stated line applies there (the offset is reported). " +
		"--- /dev/null creates a file (it must not exist), +++ /dev/null deletes one (its content must equal the removed lines). Paths resolve against the host's working directory; a/ and b/ prefixes are stripped. " +
		"CRLF files keep CRLF. Renames, mode changes and binary patches are refused (use move or write). dry_run reports per hunk what would happen without writing. " +
		"At most {{patch_max_bytes}} of patch and {{patch_max_files}} files."
	descSkill = "Load a skill's instructions on a host (from hosts or resource://skills): the SKILL.md text plus the paths of its bundled files, which read can fetch."
	descBash  = "Run a command on a host, in the host's working directory or cwd, stdin closed. Returns stdout and stderr merged. " +
		"The language is the host's shell, shown by hosts: bash (or sh) on Linux and macOS, PowerShell on Windows (pwsh, else Windows PowerShell 5.1; no profile, UTF-8 output). " +
		"On PowerShell hosts, parameters passes named values to a script that declares them with param(...), e.g. command \"param($Path) Get-Item $Path\" with parameters {\"Path\": \"C:\\\\data\"}; exit N sets the exit code. " +
		"Output is truncated to the last {{output_lines}} lines or {{output_bytes}}; the full output (its first {{spill_max}} unless the host sets otherwise) is then saved to a file on the host (path given; read it with read: commands cannot reach it; kept {{spill_age}}). " +
		"A non-zero exit or a timeout is an error. Default timeout {{bash_timeout}} s, at most {{bash_max_timeout}} s unless the host allows more. " +
		"The command is killed with its whole process group (on Windows its Job Object) on timeout or cancel; background processes it started may keep running. " +
		"For long jobs set background: true: the call returns at once with a task_id, the command runs on as a task that survives restarts of the agent and the gateway, " +
		"its output goes to a file on the host (readable with read; a task writing more than {{task_output}} is killed), and task_status waits for it. " +
		"Background tasks: default timeout {{task_timeout}}, at most {{task_max_timeout}}; at most {{task_running}} run at once per host and {{task_queued}} more wait to start, beyond that the call fails as busy (host defaults)."
	descTaskStatus = "State of a background task on a host (started by bash with background: true): queued, running, succeeded, failed, timed_out, cancelled, " +
		"or lost (the agent restarted and the task's process was gone). Waits on the host up to wait seconds (default {{task_wait}}, at most {{task_max_wait}}; 0 answers at once) " +
		"and returns as soon as the task ends; progress notifications keep the call alive meanwhile. " +
		"The answer has the exit code, start and end times, a note on how it ended, and the path of the task's full output file on the host (read it with read: commands cannot reach it); " +
		"once the task has ended, also the end of its output (last {{task_tail_lines}} lines, at most {{task_tail_bytes}}). The command is shown up to {{task_shown_command}} characters. " +
		"Finished tasks are kept {{task_retention}}, at most {{task_kept}} and {{task_kept_bytes}} of output per host (host defaults); older ones are removed."
	descTaskCancel = "Cancel a background task on a host: a queued task never starts; a running task's whole process group is killed (SIGKILL) " +
		"and it is recorded as cancelled. Returns the task's final state and the end of its output. A task that has ended already is an error naming its state."
	descTaskList = "List a host's background tasks, newest first: task_id, state (with the exit code), start time, runtime and command (first {{task_table_command}} characters; {{task_listed_command}} in the structured content). " +
		"Optional state filter and limit (default {{task_list}}, at most {{task_max_list}})."
	descList = "List a directory tree on a host: each entry's path relative to the directory, its type (file, dir, symlink with its target, other) and size. " +
		"depth bounds how deep it goes (default {{list_depth}}, at most {{list_max_depth}}). At most {{list_max_entries}} entries, shallow levels first; a note says when the listing was cut and which directories were not expanded. " +
		"Symbolic links are shown, never followed. Entries the host's path policy does not let you read are left out and counted. " +
		"Use this rather than bash ls or find: it is checked against the host's path policy, which bash commands are not."
	descSearch = "Search the lines of text files on a host for query (literal text, or an RE2 regular expression with regex: true) in one file or every file below a directory. " +
		"Output is path:line: text, at most max_results lines (default {{search_results}}, at most {{search_max_results}}) and {{output_bytes}}, each line cut to {{search_line}} characters around the match; a note says when more matches remain and what was skipped. " +
		"glob filters file names. Binary files, files over {{search_max_file}}, symbolic links and .git/.hg/.svn directories are skipped; at most {{search_max_entries}} entries are examined, for at most {{search_time}}. " +
		"Use this rather than bash grep: every file it opens is checked against the host's path policy, which bash commands are not."
	descDelete = "Delete a file or a symbolic link (the link itself, never what it points to) on a host. " +
		"A directory only with recursive: true, and only if the host's path policy lets you write it and every entry below it: all are checked before anything is deleted (at most {{tree_max_entries}} entries; never across a mount point). " +
		"The agent's own files and working directory are refused. expected_sha256 makes it fail if the file has changed. " +
		"Use this rather than bash rm: it is checked against the host's path policy, which bash commands are not."
	descMove = "Move or rename a file, symbolic link or directory on a host. destination is the full new path and must not exist: move never replaces anything. " +
		"It renames within one file system and never copies (across file systems, read and write the file, then delete it). " +
		"The host's path policy must let you read and write path and write destination, for a directory every entry below it. expected_sha256 makes it fail if the file has changed. " +
		"Use this rather than bash mv: both paths are checked against the host's path policy, which bash commands are not."
)
