package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/policy"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Under command rules, bash runs git through a guard (see policy's git
// rules): a directory first in bash's PATH holds a git that runs the
// agent's own executable in its guard mode (RunGitGuard). The guard
// checks the configuration the command would use and its arguments, then
// runs the real git with the settings that turn off what configuration
// could make it run, and with GIT_EXEC_PATH at a copy of git's own
// program directory in which git is the guard too: git runs git for
// submodules, fetches from local repositories and maintenance, and each
// of those is checked in its own repository.
//
// The guard's files live in the state directory, which no tool writes,
// under a name that is a digest of their content: agents that share the
// directory, and background tasks that outlive an agent, find the files
// they were started with. The one file that changes is deny.json, the
// host policy's bash.deny patterns, which every git process is checked
// against: a reload of the policy rewrites it.

// GitGuardFlag, as its first argument, makes the agent's executable the
// git guard: see RunGitGuard.
const GitGuardFlag = "--fleet-git-guard"

// gitGuardProbe is the guard's answer to GitGuardFlag --probe.
const gitGuardProbe = "fleet-agent git guard"

// gitShimHeader starts the git in the guard's directory.
const gitShimHeader = "#!/bin/sh\n# fleet-agent git guard:"

// gitGuardConfig is what the guard reads from its directory.
type gitGuardConfig struct {
	// Git is the real git; "" when none was found when the agent
	// started.
	Git string `json:"git"`
	// Mirror is the guard's copy of git's program directory.
	Mirror string `json:"mirror"`
	// AllowConfig are the host policy's bash.git.allow_config patterns.
	AllowConfig []string `json:"allow_config"`
}

// gitGuardDenyFile holds the deny patterns, in the guard's directory.
const gitGuardDenyFile = "deny.json"

// gitGuardDeny is what deny.json holds.
type gitGuardDeny struct {
	// Deny are the host policy's bash.deny patterns.
	Deny []string `json:"deny"`
}

// gitGuard is an installed guard.
type gitGuard struct {
	dir    string
	bin    string // holds the guard's git; first in PATH
	mirror string
	rules  *policy.GitRules
}

// installGitGuard sets up the guard that exe runs, for bash commands with
// the environment env, in stateDir.
func installGitGuard(exe, stateDir string, env []string, rules *policy.GitRules) (*gitGuard, error) {
	exe, err := filepath.Abs(exe)
	if err != nil {
		return nil, fmt.Errorf("git guard: %w", err)
	}
	if err := probeGitGuard(exe); err != nil {
		return nil, err
	}
	real := findGit(envValue(env, "PATH"))
	var execPath string
	var programs []string
	if real != "" {
		if execPath, programs, err = gitPrograms(real, env); err != nil {
			return nil, err
		}
	}
	root := filepath.Join(stateDir, "git-guard")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("git guard: %w", err)
	}
	// The directory's name is the digest of what it holds.
	sum := sha256.New()
	for _, s := range append([]string{exe, real, execPath, strings.Join(rules.AllowConfig(), "\n")}, programs...) {
		sum.Write([]byte(s + "\x00"))
	}
	dir := filepath.Join(root, hex.EncodeToString(sum.Sum(nil))[:20])
	cfg := gitGuardConfig{Git: real, Mirror: filepath.Join(dir, "exec"), AllowConfig: rules.AllowConfig()}
	files := gitGuardFiles(exe, dir, cfg)
	if err := buildGitGuard(root, dir, files, execPath, programs); err != nil {
		return nil, fmt.Errorf("git guard: %w", err)
	}
	g := &gitGuard{dir: dir, bin: filepath.Join(dir, "bin"), mirror: cfg.Mirror, rules: rules}
	if err := g.setDeny(rules); err != nil {
		return nil, err
	}
	return g, nil
}

// setDeny gives every git process from now on the deny patterns of
// rules, rules from the host policy in force.
func (g *gitGuard) setDeny(rules *policy.GitRules) error {
	data, err := json.Marshal(gitGuardDeny{Deny: rules.Deny()})
	if err != nil {
		return fmt.Errorf("git guard: %w", err)
	}
	data = append(data, '\n')
	p := filepath.Join(g.dir, gitGuardDenyFile)
	if got, err := os.ReadFile(p); err == nil && bytes.Equal(got, data) {
		return nil
	}
	if err := placeFile(p, func(tmp string) error { return os.WriteFile(tmp, data, 0o644) }); err != nil {
		return fmt.Errorf("git guard: writing its deny rules: %w", err)
	}
	return nil
}

// environ returns env for bash: git's settings, and PATH and
// GIT_EXEC_PATH leading to the guard.
func (g *gitGuard) environ(env []string) []string {
	path := envValue(env, "PATH")
	if path == "" {
		path = "/usr/local/bin:/usr/bin:/bin"
	}
	env = setEnv(g.rules.Environ(env), "PATH", g.bin+string(filepath.ListSeparator)+path)
	return setEnv(env, "GIT_EXEC_PATH", g.mirror)
}

// setEnv returns env with variable name set to value, once.
func setEnv(env []string, name, value string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k != name {
			out = append(out, kv)
		}
	}
	return append(out, name+"="+value)
}

// gitGuardFiles returns the guard's regular files by their path in dir.
func gitGuardFiles(exe, dir string, cfg gitGuardConfig) map[string][]byte {
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		panic("git guard: encoding its configuration: " + err.Error()) // strings only
	}
	shim := fmt.Sprintf("%s checks the configuration git would use, then runs it.\nexec %s %s %s \"$@\"\n",
		gitShimHeader, shellQuote(exe), GitGuardFlag, shellQuote(dir))
	return map[string][]byte{"guard.json": append(data, '\n'), filepath.Join("bin", "git"): []byte(shim)}
}

// gitGuardIntact reports whether dir holds files as they should be.
func gitGuardIntact(dir string, files map[string][]byte) bool {
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(got, want) {
			return false
		}
	}
	fi, err := os.Lstat(filepath.Join(dir, "exec", "git"))
	return err == nil && fi.Mode()&fs.ModeSymlink != 0
}

// buildGitGuard writes the guard's directory dir. A new one is written
// in root, then renamed into place, so that nobody sees it half written;
// one that exists (left by another version, or changed) is mended file by
// file, each replaced by a rename, so that bash never misses the guard
// and finds the real git instead.
func buildGitGuard(root, dir string, files map[string][]byte, execPath string, programs []string) error {
	if _, err := os.Lstat(dir); err == nil {
		return fillGitGuard(dir, files, execPath, programs)
	}
	tmp, err := os.MkdirTemp(root, ".new-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := fillGitGuard(tmp, files, execPath, programs); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil && !gitGuardIntact(dir, files) {
		return err // not another agent that wrote the same directory first
	}
	return nil
}

// fillGitGuard writes the guard's files in dir, replacing what differs.
func fillGitGuard(dir string, files map[string][]byte, execPath string, programs []string) error {
	for _, sub := range []string{"bin", "exec"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	for name, data := range files {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err == nil && bytes.Equal(got, data) {
			continue
		}
		if err := placeFile(filepath.Join(dir, name), func(tmp string) error { return os.WriteFile(tmp, data, 0o755) }); err != nil {
			return err
		}
	}
	// The copy of git's program directory: git is the guard, the rest
	// are git's own.
	links := map[string]string{"git": filepath.Join("..", "bin", "git")}
	for _, name := range programs {
		links[name] = filepath.Join(execPath, name)
	}
	for name, target := range links {
		p := filepath.Join(dir, "exec", name)
		if got, err := os.Readlink(p); err == nil && got == target {
			continue
		}
		if err := placeFile(p, func(tmp string) error { return os.Symlink(target, tmp) }); err != nil {
			return err
		}
	}
	return nil
}

// placeFile creates a file next to path with create, then renames it
// over path.
func placeFile(path string, create func(tmp string) error) error {
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".new-%s-%d", filepath.Base(path), os.Getpid()))
	os.Remove(tmp)
	if err := create(tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// findGit returns the first git in path that is not a guard's, or "".
func findGit(path string) string {
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, "git")
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 || isGitShim(p) {
			continue
		}
		return p
	}
	return ""
}

// isGitShim reports whether the file at p is a guard's git.
func isGitShim(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, len(gitShimHeader))
	n, _ := f.Read(head)
	return string(head[:n]) == gitShimHeader
}

// gitPrograms returns git's program directory (git --exec-path) and the
// names in it but git.
func gitPrograms(git string, env []string) (string, []string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, git, "--exec-path")
	cmd.Env = env
	out, err := cmd.Output()
	if err != nil {
		return "", nil, fmt.Errorf("git guard: %s --exec-path: %w", git, err)
	}
	dir := strings.TrimSpace(string(out))
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", nil, fmt.Errorf("git guard: git's program directory: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.Name() != "git" {
			names = append(names, e.Name())
		}
	}
	return dir, names, nil
}

// probeGitGuard makes sure exe runs the guard: an executable that does
// not would make every git command fail.
func probeGitGuard(exe string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, exe, GitGuardFlag, "--probe").Output()
	if err != nil || strings.TrimSpace(string(out)) != gitGuardProbe {
		return fmt.Errorf("git guard: %s %s --probe answered %q (%w): the executable given to run the git guard does not run it (call agent.RunGitGuard first thing in its main)",
			exe, GitGuardFlag, protocol.Ellipsis(string(out), 200), err)
	}
	return nil
}

// envValue returns the value of variable name in env, the last one set.
func envValue(env []string, name string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}

// errGitGuardUnset is returned when a policy needs the git guard and the
// agent was given no executable to run it.
var errGitGuardUnset = errors.New("the host policy was read for an agent that runs git through its git guard, but no executable runs the guard (set GitGuard)")
