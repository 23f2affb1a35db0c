package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/confine"
	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/agent/tasks"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// toolbox runs the file and shell tools of one host. It is safe for
// concurrent use.
type toolbox struct {
	cfg   toolboxConfig
	shell string   // cfg.Shell resolved to an executable path
	env   []string // cfg.ChildEnv without the agent's own variables
	home  string   // the user's home directory; empty if unknown
	guard *guard
	// locks serialise the mutations of files, here and against other
	// processes.
	locks *safefs.Locks
	// imageSem admits one image conversion at a time (see imageResult).
	imageSem chan struct{}
	tasks    *tasks.Manager
	// skills is the host's skill catalog, read through guard; nil: the
	// host has no skills. It is set once, before the first call.
	skills *catalog
	// journals keeps patch commits all or nothing across a crash.
	journals *patchJournals
	// gitGuard runs git for bash under command rules; nil otherwise.
	gitGuard *gitGuard
	// jail keeps every command the toolbox starts away from the agent's
	// own files.
	jail *commandJail
}

// newToolbox validates cfg and returns a toolbox for it. It creates
// cfg.StateDir (mode 0700) if it does not exist.
func newToolbox(cfg toolboxConfig) (*toolbox, error) {
	if err := checkCwd(cfg.Cwd); err != nil {
		return nil, err
	}
	if cfg.Shell == "" {
		return nil, errors.New("toolbox: shell is empty; set it to a shell such as /bin/bash")
	}
	shell, err := exec.LookPath(cfg.Shell)
	if err == nil {
		// Commands run in Cwd: a relative shell path must not move with it.
		shell, err = filepath.Abs(shell)
	}
	if err != nil {
		return nil, fmt.Errorf("toolbox: shell %q is not an executable file (%w); set it to a shell such as /bin/bash", cfg.Shell, err)
	}
	if cfg.BashDefaultTimeout <= 0 || cfg.BashMaxTimeout <= 0 {
		return nil, fmt.Errorf("toolbox: bash timeouts must be positive (default %v, max %v); use e.g. 120s and 600s", cfg.BashDefaultTimeout, cfg.BashMaxTimeout)
	}
	if cfg.BashDefaultTimeout > cfg.BashMaxTimeout {
		return nil, fmt.Errorf("toolbox: default bash timeout %v exceeds the maximum %v; lower the default or raise the maximum", cfg.BashDefaultTimeout, cfg.BashMaxTimeout)
	}
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return nil, fmt.Errorf("toolbox: state directory %q is not an absolute path; give one such as /var/lib/fleet-agent", cfg.StateDir)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("toolbox: create state directory: %w; make its parent writable or choose another directory", err)
	}
	if cfg.Home != "" && !filepath.IsAbs(cfg.Home) {
		return nil, fmt.Errorf("toolbox: home directory %q is not an absolute path", cfg.Home)
	}
	if err := cfg.setMediaDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.setBashLimits(); err != nil {
		return nil, err
	}
	g, err := newGuard(cfg.Policy, ownFiles{PolicyFile: cfg.PolicyFile, SecretFiles: cfg.SecretFiles, Protected: cfg.ProtectedPaths, StateDir: cfg.StateDir,
		FleetSkills: cfg.FleetSkills})
	if err != nil {
		return nil, fmt.Errorf("toolbox: the agent's own files: %w", err)
	}
	env := childEnv(cfg.ChildEnv)
	var gg *gitGuard
	if rules := cfg.Policy.GitRules(); rules != nil && cfg.Policy.GitGuarded() {
		if cfg.GitGuard == "" {
			return nil, fmt.Errorf("toolbox: %w", errGitGuardUnset)
		}
		if gg, err = installGitGuard(cfg.GitGuard, cfg.StateDir, env, rules); err != nil {
			return nil, fmt.Errorf("toolbox: %w", err)
		}
		env = gg.environ(env)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	jail, err := newCommandJail(cfg.ConfineCommands, cfg.ConfineHelper, cfg.confinePaths())
	if err != nil {
		return nil, fmt.Errorf("toolbox: %w", err)
	}
	// Background tasks run a command as bash runs it (see invocation),
	// the script it needs written beside the task's files.
	invoke := func(shell, script, command string, params map[string]json.RawMessage) ([]string, []string, error) {
		inv, _, err := invocation(shell, script, command, params)
		if err == nil {
			inv, err = jail.wrapInvocation(inv)
		}
		return inv.argv, inv.env, err
	}
	tm, err := tasks.New(cfg.Tasks, tasks.Setup{StateDir: cfg.StateDir, Shell: shell, Cwd: cfg.Cwd, Env: env, Wrapper: cfg.TaskWrapper,
		Invocation: invoke, Log: log.With("component", "tasks")})
	if err != nil {
		return nil, fmt.Errorf("toolbox: %w", err)
	}
	t := &toolbox{cfg: cfg, shell: shell, env: env, home: cfg.Home, guard: g, tasks: tm, jail: jail,
		imageSem: make(chan struct{}, 1), gitGuard: gg, locks: safefs.NewLocks(func(p string) string { return pathKey(p, foldNames) })}
	t.journals, err = newPatchJournals(cfg.StateDir, g, log.With("component", "patch"), t.lockFiles)
	if err != nil {
		return nil, fmt.Errorf("toolbox: %w", err)
	}
	t.journals.hook = cfg.recoverHook
	// A patch a previous process was killed in the middle of is finished
	// or undone before any tool runs.
	t.journals.recover()
	return t, nil
}

// confinePaths are what commands are kept from: the agent's state
// directory and every file no tool may touch, protected; the git guard's
// files (in the state directory), the fleet's skills (in the state
// directory by default; wherever they are, commands run their scripts
// but never change them) and the host's skills directory, read-only.
// A skills directory in the working directory is left as writable as
// the rest of it: making it read-only would take from commands the right
// to create anything in the working directory itself (see package
// confine), and the file tools may write it anyway.
func (c *toolboxConfig) confinePaths() confine.Paths {
	p := confine.Paths{
		Protected: slices.Concat([]string{c.StateDir}, c.SecretFiles, c.ProtectedPaths),
		ReadOnly:  []string{filepath.Join(c.StateDir, "git-guard")},
	}
	if c.FleetSkills != "" {
		p.ReadOnly = append(p.ReadOnly, c.FleetSkills)
	}
	if c.SkillsDir != "" && !inDir(c.SkillsDir, c.Cwd) {
		p.ReadOnly = append(p.ReadOnly, c.SkillsDir)
	}
	return p
}

// inDir reports whether path is dir or lies inside it (both clean).
func inDir(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// toolNames lists the tools a host policy may name: those a toolbox
// serves, less the task tools, which come with bash.
func toolNames() []string {
	names := slices.Sorted(maps.Keys((*toolbox)(nil).tools()))
	return slices.DeleteFunc(names, func(n string) bool { return slices.Contains(taskToolNames(), n) })
}

// checkCwd reports whether dir can serve as the working directory.
func checkCwd(dir string) error {
	if dir == "" || !filepath.IsAbs(dir) {
		return fmt.Errorf("toolbox: working directory %q is not an absolute path; give one such as /home/user", dir)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("toolbox: working directory: %w; create it or choose another", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("toolbox: working directory %s is not a directory; choose a directory", dir)
	}
	return nil
}

// tools returns the toolbox's tools by name: each a tool protocol
// declares (protocol.HostTools), whose arguments it decodes into the
// declared type.
func (t *toolbox) tools() map[string]toolFunc {
	return map[string]toolFunc{
		protocol.ToolRead:       t.read,
		protocol.ToolWrite:      t.write,
		protocol.ToolEdit:       t.edit,
		protocol.ToolBash:       t.bash,
		protocol.ToolSkill:      t.skill,
		protocol.ToolTaskStatus: t.taskStatus,
		protocol.ToolTaskCancel: t.taskCancel,
		protocol.ToolTaskList:   t.taskList,
		protocol.ToolList:       t.list,
		protocol.ToolSearch:     t.search,
		protocol.ToolDelete:     t.delete,
		protocol.ToolMove:       t.move,
		protocol.ToolPatch:      t.patch,
	}
}

// withPolicy returns the toolbox a call held to pol runs with (a host
// policy narrowed for the call's caller): the same files, locks, tasks
// and journals, its paths and commands checked against pol.
func (t *toolbox) withPolicy(pol *policy.Policy) *toolbox {
	c := *t
	c.guard = t.guard.withPolicy(pol)
	return &c
}

// resolve turns a path given by a caller into a clean absolute path: "~"
// and "~/..." ("~\..." on Windows) are relative to the user's home, other
// relative paths to the working directory. On Windows a path rooted
// without a drive (\x) or naming a drive without a separator (C:x) is
// refused: it is relative to something other than the working directory.
func (t *toolbox) resolve(p string) (string, error) {
	switch {
	case p == "":
		return "", errors.New("path is empty; give a file path")
	case onWindows && safefs.WinRelativeProblem(p) != "":
		return "", errors.New(safefs.WinRelativeProblem(p))
	case p == "~" || strings.HasPrefix(p, "~/") || onWindows && strings.HasPrefix(p, `~\`):
		if t.home == "" {
			return "", fmt.Errorf("cannot expand %s: the agent's user has no home directory; give an absolute path", p)
		}
		return filepath.Join(t.home, p[1:]), nil
	case filepath.IsAbs(p):
		return filepath.Clean(p), nil
	default:
		return filepath.Join(t.cfg.Cwd, p), nil
	}
}

// lockFile serialises mutations of the file at path, a path whose last
// element is not a symbolic link, and returns the function that ends the
// critical section (see lockFiles).
func (t *toolbox) lockFile(path string) (unlock func(), err error) {
	return t.lockFiles(path)
}

// lockFiles locks the files at paths for a mutation of all of them,
// against the agent's other mutations and other processes (Locks).
func (t *toolbox) lockFiles(paths ...string) (unlock func(), err error) {
	return t.locks.Lock(paths...)
}

// decodeArgs decodes tc.Args strictly into v, a pointer to a tool's
// argument struct (protocol.HostTools). It returns nil on success and a
// bad-request result naming the problem otherwise. Missing arguments
// decode as an empty object. The "host" argument the caller addressed the
// call with (protocol.OnHost) is accepted, so the gateway can forward
// arguments unchanged; the call itself says which host it is for.
func decodeArgs(tc *toolCall, tool string, v any) *protocol.Result {
	data := bytes.TrimSpace(tc.Args)
	if len(data) == 0 {
		data = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("unexpected data after the arguments object")
		}
	}
	if err != nil {
		return toolBadArgs(tc, tool, "%s", describeDecodeError(err, v))
	}
	return nil
}

// describeDecodeError rewrites an encoding/json error for a model: it names
// the field and what it should be.
func describeDecodeError(err error, v any) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr) && typeErr.Field != "":
		return fmt.Sprintf("field %q must be %s, not %s", jsonPath(reflect.TypeOf(v), typeErr.Field), kindName(typeErr.Type), typeErr.Value)
	case errors.As(err, &typeErr):
		return fmt.Sprintf("arguments must be a JSON object, not %s", typeErr.Value)
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("malformed JSON at byte %d: %s", syntaxErr.Offset, strings.TrimPrefix(syntaxErr.Error(), "json: "))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		return fmt.Sprintf("unknown field %s; the arguments are %s", name, strings.Join(jsonFields(reflect.TypeOf(v)), ", "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: the arguments end too early"
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

// jsonPath removes from field, the path of a field of t in a decoding
// error, the Go names of embedded structs, which encoding/json includes
// and a caller never sees.
func jsonPath(t reflect.Type, field string) string {
	embedded, seen := map[string]bool{}, map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return
		}
		seen[t] = true
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous {
				embedded[f.Name] = true
			}
			walk(f.Type)
		}
	}
	walk(t)
	parts := strings.Split(field, ".")
	kept := parts[:0]
	for _, p := range parts {
		if !embedded[p] {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, ".")
}

// kindName describes a Go type the way a JSON schema would.
func kindName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	default:
		return "an object"
	}
}

// jsonFields lists the JSON names of the fields of struct type t (or of
// the struct t points to), with the fields of arrays of objects as
// "name[].field".
func jsonFields(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			// Promoted, as encoding/json does; host addresses the call
			// and is not one of the tool's arguments.
			if f.Type != reflect.TypeFor[protocol.OnHost]() {
				names = append(names, jsonFields(f.Type)...)
			}
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		names = append(names, name)
		if f.Type.Kind() == reflect.Slice {
			for _, sub := range jsonFields(f.Type.Elem()) {
				names = append(names, name+"[]."+sub)
			}
		}
	}
	return names
}

// toolText returns a successful result carrying text.
func toolText(tc *toolCall, text string) *protocol.Result {
	return &protocol.Result{CallID: tc.ID, Content: []protocol.Content{protocol.Text(text)}}
}

// toolFailure returns a result the model sees as a tool error.
func toolFailure(tc *toolCall, format string, args ...any) *protocol.Result {
	r := toolText(tc, fmt.Sprintf(format, args...))
	r.IsError = true
	return r
}

// toolBadArgs returns the bad-request result for a call whose arguments
// are invalid.
func toolBadArgs(tc *toolCall, tool, format string, args ...any) *protocol.Result {
	return protocol.ErrorResult(tc.ID, protocol.CodeBadRequest, tool+": invalid arguments: "+fmt.Sprintf(format, args...))
}
