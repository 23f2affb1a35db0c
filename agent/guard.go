package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/agent/tasks"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// guard decides what the tools may touch: never the agent's own files,
// and for everything else what the host policy allows.
//
// The agent's own files are its policy file, its credentials, its state
// directory, the paths its operator protects (such as the data directory
// of the gateway an in-process agent runs in) and its own process under
// /proc. Whatever the policy says, no tool writes any of them; no tool
// reads the credentials, the protected paths, the process or the state
// directory's internals. Bash full-output files and background tasks'
// output files in the state directory stay readable (the bash and task
// tools point at them), subject only to the policy's deny rules, even when
// the state directory lies in a protected one. Credentials and protected
// files are refused by name and, when opened under another name (a hard
// link), by identity.
type guard struct {
	// pol is the host policy in force (nil: unrestricted); a reload
	// swaps it, and each check reads it once.
	pol     atomic.Pointer[policy.Policy]
	own     []ownPath
	outputs []string   // the directory of bash full-output files, as given and resolved
	tasks   []string   // the directory of background tasks, as given and resolved
	fleet   []string   // the fleet's skills directory, as given and resolved
	secrets []secretID // the identities of the credentials and protected files
	pid     int
}

// secretID is a file no tool may read under any name.
type secretID struct {
	// fi describes the open file (so that on Windows it holds the
	// volume serial number and file index os.SameFile compares).
	fi   fs.FileInfo
	what string // for messages, such as "the agent's credentials"
}

// ownPath is one of the agent's own files or directories.
type ownPath struct {
	path     string // absolute and clean
	what     string // for messages, such as "its state directory"
	readable bool   // tools may read it (the policy file)
	state    bool   // the state directory
}

// ownError is a refusal to touch the agent's own files.
type ownError struct{ msg string }

func (e *ownError) Error() string { return e.msg }

// ownFiles are the agent's own files, which no tool may touch whatever
// the host policy says (see guard).
type ownFiles struct {
	PolicyFile  string
	SecretFiles []string
	// Protected are files and directories kept from the tools as the
	// credentials are.
	Protected []string
	StateDir  string // must exist
	// FleetSkills is the directory of the skills the fleet installed:
	// no tool writes in it; reads follow the policy's deny rules only,
	// for the skills the policy shows (see guard.fleetSkill).
	FleetSkills string
}

// newGuard returns the guard for pol and the agent's own files.
func newGuard(pol *policy.Policy, files ownFiles) (*guard, error) {
	policyFile, secretFiles, stateDir := files.PolicyFile, files.SecretFiles, files.StateDir
	g := &guard{pid: os.Getpid()}
	g.pol.Store(pol)
	add := func(p, what string, readable, state bool) error {
		abs, err := filepath.Abs(p)
		if err != nil {
			return err
		}
		g.own = append(g.own, ownPath{abs, what, readable, state})
		// Where the links on the way lead (junctions too, on Windows),
		// even for a file not made yet.
		if real, err := safefs.RealPath(abs); err == nil && real != abs {
			g.own = append(g.own, ownPath{real, what, readable, state})
		}
		return nil
	}
	// The fleet's skills first: a refusal there names them, also when
	// they lie in the state directory (the default).
	var errs []error
	if files.FleetSkills != "" {
		errs = append(errs, add(files.FleetSkills, "the skills the fleet installed, which only the agent writes", true, false))
		for _, o := range g.own {
			g.fleet = append(g.fleet, o.path)
		}
	}
	errs = append(errs, add(stateDir, "its state directory", false, true))
	if policyFile != "" {
		errs = append(errs, add(policyFile, "its policy file", true, false))
	}
	secret := func(f, what string) {
		if fi, err := openedInfo(f); err == nil && !fi.IsDir() {
			g.secrets = append(g.secrets, secretID{fi, what})
		}
	}
	for _, f := range secretFiles {
		errs = append(errs, add(f, "its credentials", false, false))
		secret(f, "the agent's credentials")
	}
	for _, f := range files.Protected {
		errs = append(errs, add(f, "a protected path", false, false))
		secret(f, "a protected file")
	}
	for _, o := range g.own {
		if o.state {
			g.outputs = append(g.outputs, filepath.Join(o.path, "output"))
			g.tasks = append(g.tasks, filepath.Join(o.path, "tasks"))
		}
	}
	return g, errors.Join(errs...)
}

// withPolicy returns a guard of the same files that checks against pol
// (fixed: a reload does not change it).
func (g *guard) withPolicy(pol *policy.Policy) *guard {
	c := &guard{own: g.own, outputs: g.outputs, tasks: g.tasks, fleet: g.fleet, secrets: g.secrets, pid: g.pid}
	c.pol.Store(pol)
	return c
}

// checkPath resolves given, an absolute clean path, and returns the file
// it names once links are followed, if the tools may do every one of ops
// with it. A refusal is an *ownError or a *policy.Denial; other errors
// come from resolving the path.
func (g *guard) checkPath(given string, ops ...policy.Op) (string, error) {
	resolved, err := safefs.RealPath(given)
	if err != nil {
		return "", err
	}
	if err := g.checkResolved(given, resolved, ops...); err != nil {
		return "", err
	}
	return resolved, nil
}

// checkResolved is checkPath for a path already resolved: resolved is
// what given names once its links are followed (or, for a tool that acts
// on a link itself, once the links in its parent are). The tools that
// walk a directory opened without following links check its entries
// with it.
func (g *guard) checkResolved(given, resolved string, ops ...policy.Op) error {
	pol := g.pol.Load()
	for _, op := range ops {
		if err := g.checkOwn(op, given, resolved); err != nil {
			return err
		}
		check := pol.CheckPath
		if op == policy.Read && (g.isOutputFile(resolved) || g.fleetSkill(pol, resolved)) {
			// The bash tool hands output files out; the skill tool the
			// folders of the fleet's skills the policy shows.
			check = pol.CheckPathDeny
		}
		if err := check(op, given, resolved); err != nil {
			return err
		}
	}
	return nil
}

// checkOwn refuses op on the agent's own files.
func (g *guard) checkOwn(op policy.Op, given, resolved string) error {
	for _, o := range g.own {
		for _, p := range []string{given, resolved} {
			if !within(p, o.path) {
				continue
			}
			switch {
			case op == policy.Write:
			case o.readable:
				continue
			case p == resolved && g.isOutputFile(p):
				// The bash and task tools hand these out, wherever the
				// state directory is.
				continue
			case g.inFleetSkills(resolved):
				// The fleet's skills are read wherever they are kept
				// (by default in the state directory); never written.
				continue
			}
			return g.refuseOwn(op, given, resolved, o.path, o.what)
		}
	}
	if g.isOwnProcess(resolved) {
		return g.refuseOwn(op, given, resolved, "/proc/"+strconv.Itoa(g.pid), "its own process: memory, environment, open files")
	}
	return nil
}

func (g *guard) refuseOwn(op policy.Op, given, resolved, path, what string) error {
	shown := given
	if resolved != given {
		shown += " (resolves to " + resolved + ")"
	}
	return &ownError{fmt.Sprintf("denied: %s %s: %s belongs to the agent (%s); no tool may %s it, whatever the host policy says",
		op, shown, path, what, op)}
}

// isOutputFile reports whether p is a bash full-output file or the
// output file of a background task.
func (g *guard) isOutputFile(p string) bool {
	for _, dir := range g.outputs {
		if samePath(filepath.Dir(p), dir) && strings.HasSuffix(pathKey(p, foldNames), pathKey(".log", foldNames)) {
			return true
		}
	}
	if !samePath(filepath.Base(p), tasks.OutputFileName) {
		return false
	}
	task := filepath.Dir(p)
	for _, dir := range g.tasks {
		if samePath(filepath.Dir(task), dir) && tasks.ValidID(filepath.Base(task)) == nil {
			return true
		}
	}
	return false
}

// inFleetSkills reports whether p is in the fleet's skills directory.
func (g *guard) inFleetSkills(p string) bool {
	for _, dir := range g.fleet {
		if within(p, dir) {
			return true
		}
	}
	return false
}

// fleetSkill reports whether p is a file of a skill the fleet installed
// that pol shows: <fleet>/<name>/... or <fleet>/.fleet/<name>/....
func (g *guard) fleetSkill(pol *policy.Policy, p string) bool {
	for _, dir := range g.fleet {
		if !within(p, dir) {
			continue
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return false
		}
		parts := strings.Split(filepath.ToSlash(rel), "/")
		name := parts[0]
		if name == fleetDir {
			if len(parts) < 2 {
				return false
			}
			name = parts[1]
		}
		return protocol.ValidateSkillName(name) == nil && pol.AllowSkill(name)
	}
	return false
}

// isOwnProcess reports whether p is under /proc/PID for the agent's
// process or one of its threads.
func (g *guard) isOwnProcess(p string) bool {
	rest, ok := strings.CutPrefix(p, "/proc/")
	if !ok {
		return false
	}
	id, _, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(id)
	if err != nil || n <= 0 {
		return false
	}
	if n == g.pid {
		return true
	}
	_, err = os.Lstat(fmt.Sprintf("/proc/%d/task/%d", g.pid, n))
	return err == nil
}

// checkOpened refuses a file opened for reading that is one of the
// credentials or protected files under another name.
func (g *guard) checkOpened(display string, fi fs.FileInfo) error {
	for _, s := range g.secrets {
		if os.SameFile(s.fi, fi) {
			return &ownError{fmt.Sprintf("denied: read %s: it is %s under another name (a hard link); no tool may read it", display, s.what)}
		}
	}
	return nil
}

// openedInfo describes the file at path (links followed) from an open
// handle, which on every system carries the file's identity. A file that
// is not regular (a FIFO) is only described: opening it could block.
func openedInfo(path string) (fs.FileInfo, error) {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return fi, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Stat()
}

// checkCommandIn checks a bash command line that runs in dir against the
// policy's command rules; the files its redirections open must pass
// checkRedirect.
func (g *guard) checkCommandIn(line, dir string) error {
	return g.pol.Load().CheckCommandIn(line, dir, g.checkRedirect)
}

// checkRedirect checks a file a redirection opens for ops. path is what
// the shell opens, not cleaned: it is resolved the way the kernel will
// (see safefs.ShellPath), and the path rules decide on that file, deny rules
// also on path with ".." collapsed as written. A target that cannot be
// resolved that way is refused.
func (g *guard) checkRedirect(path string, ops ...policy.Op) error {
	resolved, err := safefs.ShellPath(path)
	if err != nil {
		return &policy.Denial{Rule: "paths", Reason: fmt.Sprintf("%s cannot be checked: %s", path, safefs.Problem(path, err))}
	}
	return g.checkResolved(filepath.Clean(path), resolved, ops...)
}

// within reports whether p is dir or inside it. On Windows names are
// compared without case, as NTFS does.
func within(p, dir string) bool {
	return withinKey(pathKey(p, foldNames), pathKey(dir, foldNames), string(filepath.Separator))
}

// withinKey is within for paths already in their pathKey form, with sep
// between names.
func withinKey(p, dir, sep string) bool {
	return p == dir || strings.HasSuffix(dir, sep) && strings.HasPrefix(p, dir) || strings.HasPrefix(p, dir+sep)
}

// onWindows says whether the agent runs on Windows; onDarwin whether on
// macOS, whose default file system (APFS) compares names without regard
// to case and Unicode normalization; foldNames whether this system's file
// names compare without case.
const (
	onWindows = runtime.GOOS == "windows"
	onDarwin  = runtime.GOOS == "darwin" || runtime.GOOS == "ios"
	foldNames = onWindows || onDarwin
)

// pathKey is the form in which the agent compares path p with another:
// with fold, as the system's file names compare: on Windows letters
// folded as NTFS folds them for its comparisons, elsewhere (macOS) case
// and Unicode normalization folded as APFS does (policy.FoldName).
func pathKey(p string, fold bool) string {
	switch {
	case !fold:
		return p
	case onWindows:
		return strings.ToUpper(p)
	}
	return policy.FoldName(p)
}

// samePath reports whether a and b name the same path on this system.
func samePath(a, b string) bool { return pathKey(a, foldNames) == pathKey(b, foldNames) }

// isDenied reports whether err is a refusal rather than a failure.
func isDenied(err error) bool {
	var d *policy.Denial
	var o *ownError
	return errors.As(err, &d) || errors.As(err, &o)
}

// deniedResult is the result of a call the host refuses.
func deniedResult(tc *toolCall, err error) *protocol.Result {
	return protocol.ErrorResult(tc.ID, protocol.CodeDenied, err.Error())
}

// pathFailure is the result of a call whose path was refused or could not
// be resolved.
// checkedPath resolves a tool's path argument and checks it against the
// host policy for ops. It returns the path as resolved for messages, the
// checked target to open, or the result that refuses the call.
func (t *toolbox) checkedPath(tc *toolCall, raw string, ops ...policy.Op) (path, target string, r *protocol.Result) {
	path, err := t.resolve(raw)
	if err != nil {
		return "", "", toolFailure(tc, "%v", err)
	}
	if target, err = t.guard.checkPath(path, ops...); err != nil {
		return "", "", pathFailure(tc, path, err)
	}
	return path, target, nil
}

func pathFailure(tc *toolCall, path string, err error) *protocol.Result {
	if isDenied(err) {
		return deniedResult(tc, err)
	}
	return toolFailure(tc, "%s", safefs.Problem(path, err))
}

// loadPolicy reads and parses the host policy file; no file means
// unrestricted.
func loadPolicy(file string, env policy.Env) (*policy.Policy, error) {
	switch {
	case file == "" && env.OS == "windows":
		// Unrestricted, but with Windows' path checks: UNC and device
		// paths stay refused unless a policy allows them.
		return policy.Parse(nil, env)
	case file == "":
		return nil, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("host policy: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, policy.MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("host policy: read %s: %w", file, err)
	}
	p, err := policy.Parse(data, env)
	if err != nil {
		return nil, fmt.Errorf("host policy %s: %w", file, err)
	}
	return p, nil
}
