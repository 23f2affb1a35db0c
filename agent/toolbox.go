package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

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
	locks *pathLocks
	// dirLocks keeps other processes out of directories being changed.
	dirLocks *dirLocks
	// imageSem admits one image conversion at a time (see imageResult).
	imageSem chan struct{}
	tasks    *taskManager
	// skills is the host's skill catalog, read through guard; nil: the
	// host has no skills. It is set once, before the first call.
	skills *catalog
	// journals keeps patch commits all or nothing across a crash.
	journals *patchJournals
	// gitGuard runs git for bash under command rules; nil otherwise.
	gitGuard *gitGuard
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
		return nil, fmt.Errorf("toolbox: shell %q is not an executable file (%v); set it to a shell such as /bin/bash", cfg.Shell, err)
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
	g, err := newGuard(cfg.Policy, ownFiles{PolicyFile: cfg.PolicyFile, SecretFiles: cfg.SecretFiles, Protected: cfg.ProtectedPaths, StateDir: cfg.StateDir})
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
	tasks, err := newTaskManager(cfg.Tasks, cfg.StateDir, shell, cfg.Cwd, env, log.With("component", "tasks"))
	if err != nil {
		return nil, fmt.Errorf("toolbox: %w", err)
	}
	tasks.wrapper = cfg.TaskWrapper
	t := &toolbox{cfg: cfg, shell: shell, env: env, home: cfg.Home, guard: g, tasks: tasks,
		imageSem: make(chan struct{}, 1), gitGuard: gg, locks: &pathLocks{}, dirLocks: &dirLocks{}}
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

// tools returns the toolbox's tools by name.
func (t *toolbox) tools() map[string]toolFunc {
	return map[string]toolFunc{
		"read":        t.read,
		"write":       t.write,
		"edit":        t.edit,
		"bash":        t.bash,
		"skill":       t.skill,
		"task_status": t.taskStatus,
		"task_cancel": t.taskCancel,
		"task_list":   t.taskList,
		"list":        t.list,
		"search":      t.search,
		"delete":      t.delete,
		"move":        t.move,
		"patch":       t.patch,
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
	case onWindows && winRelativeProblem(p) != "":
		return "", errors.New(winRelativeProblem(p))
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
// critical section. Paths that reach the file through different directory
// links share one lock. See lockFiles.
func (t *toolbox) lockFile(path string) (unlock func(), err error) {
	return t.lockFiles(path)
}

// lockFiles locks the files at paths for a mutation of all of them. Within
// the agent each file has its own lock. Against other processes — another
// agent on the same host, say — each file's directory is locked with
// flock, held only while this agent has a mutation running in it, so that
// two agents cannot both pass a compare-and-swap check before either
// renames. File locks are taken first, then directory locks, each in
// sorted order, so that mutations of several files cannot deadlock, here
// or across processes. A directory that does not exist yet is not locked
// (there is nothing in it to check). A directory some other process keeps
// locked for longer than dirLockWait fails the call with errDirLocked.
func (t *toolbox) lockFiles(paths ...string) (unlock func(), err error) {
	keys := make([]string, len(paths))
	dirs := map[string]string{} // the key of each directory: the directory
	for i, p := range paths {
		keys[i] = lockKey(p)
		dirs[filepath.Dir(keys[i])] = filepath.Dir(lockPath(p))
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)
	var undo []func()
	release := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	for _, k := range keys {
		undo = append(undo, t.locks.lock(k))
	}
	for _, k := range slices.Sorted(maps.Keys(dirs)) {
		u, err := t.dirLocks.lock(k, dirs[k])
		if err != nil {
			release()
			return nil, err
		}
		undo = append(undo, u)
	}
	return release, nil
}

// dirLockWait bounds how long a mutation waits for another process's lock
// on a directory.
const dirLockWait = 10 * time.Second

// errDirLocked reports a directory another process keeps locked.
var errDirLocked = errors.New("another process has held a lock on this directory for more than 10 s (another fleet agent on this host would hold it for milliseconds); nothing was changed, try again")

// dirLocks holds this agent's flock on each directory it is changing
// files in. The flock is shared by all of the agent's mutations in the
// directory (their files have their own locks) and released when the
// last of them ends.
type dirLocks struct {
	mu sync.Mutex
	m  map[string]*dirLock
}

type dirLock struct {
	ready   chan struct{} // closed once release and err are set
	release func()        // nil when there was nothing to lock
	err     error
	refs    int // guarded by dirLocks.mu
}

// lock locks dir, known as key (its pathKey), against other processes
// and returns the function that unlocks it.
func (l *dirLocks) lock(key, dir string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*dirLock{}
	}
	e := l.m[key]
	if e == nil {
		e = &dirLock{ready: make(chan struct{})}
		l.m[key] = e
		e.refs++
		l.mu.Unlock()
		e.release, e.err = flockDir(dir, dirLockWait)
		if errors.Is(e.err, fs.ErrNotExist) {
			e.release, e.err = nil, nil // nothing there to protect yet
		}
		close(e.ready)
	} else {
		e.refs++
		l.mu.Unlock()
		<-e.ready
	}
	release := func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if e.refs--; e.refs == 0 {
			delete(l.m, key)
			if e.release != nil {
				e.release()
			}
		}
	}
	if e.err != nil {
		err := fmt.Errorf("%s: %w", dir, e.err)
		release()
		return nil, err
	}
	return release, nil
}

// lockKey is the name under which lockFile locks path: lockPath, on
// Windows without case, as NTFS names one file C:\A.txt and c:\a.TXT.
func lockKey(path string) string { return pathKey(lockPath(path), foldNames) }

// lockPath is path with the links in its directory followed.
func lockPath(path string) string {
	if dir, err := filepath.EvalSymlinks(filepath.Dir(path)); err == nil {
		return filepath.Join(dir, filepath.Base(path))
	}
	return path
}

// pathLocks serialises mutations of one file. Entries exist only while
// someone holds or waits for them, so the map stays small.
type pathLocks struct {
	mu sync.Mutex
	m  map[string]*pathLock
}

type pathLock struct {
	mu   sync.Mutex
	refs int // holders plus waiters; guarded by pathLocks.mu
}

// lock locks path and returns the function that unlocks it.
func (l *pathLocks) lock(path string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = make(map[string]*pathLock)
	}
	e := l.m[path]
	if e == nil {
		e = new(pathLock)
		l.m[path] = e
	}
	e.refs++
	l.mu.Unlock()

	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, path)
		}
		l.mu.Unlock()
	}
}

// size returns the number of paths locked or waited for.
func (l *pathLocks) size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// decodeArgs decodes tc.Args strictly into v, a pointer to an argument
// struct. It returns nil on success and a bad-request result naming the
// problem otherwise. Missing arguments decode as an empty object.
// hostArg accepts the "host" argument the caller addressed the call with,
// so the gateway can forward arguments unchanged. The call itself says
// which host it is for; this field is not used.
type hostArg struct {
	Host string `json:"host,omitempty"`
}

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
			if f.Type != reflect.TypeFor[hostArg]() {
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
