package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/fleetmcp/fleetmcp/policy"
)

// maxGitConfigList bounds the configuration listing the guard reads.
const maxGitConfigList = 16 << 20

// Exit statuses of a git command the guard does not run.
const (
	gitRefused  = 126 // refused by the host policy
	gitNotFound = 127 // no git was found
)

// RunGitGuard runs the git guard when args, a program's arguments with
// its name first (os.Args), ask for it, and reports whether they did.
// Every program given as Config.GitGuard calls it first thing in main:
//
//	if code, ok := agent.RunGitGuard(os.Args); ok {
//		os.Exit(code)
//	}
//
// The guard checks a git command line and the configuration it would
// run with, then replaces itself with git, or returns the exit status of
// a command it refused, having said why on standard error.
func RunGitGuard(args []string) (int, bool) {
	if len(args) < 3 || args[1] != GitGuardFlag {
		return 0, false
	}
	if args[2] == "--probe" {
		fmt.Println(gitGuardProbe)
		return 0, true
	}
	err := guardGit(args[2], args[3:], os.Environ(), os.Stderr, syscall.Exec)
	var ge *gitGuardError
	if errors.As(err, &ge) && ge.code != 0 {
		if ge.msg != "" {
			fmt.Fprintf(os.Stderr, "fleet-agent git guard: %s\n", ge.msg)
		}
		return ge.code, true
	}
	fmt.Fprintf(os.Stderr, "fleet-agent git guard: %v\n", err)
	return gitRefused, true
}

// gitGuardError ends a git command the guard does not run.
type gitGuardError struct {
	code int
	msg  string // "" when git said it already
}

func (e *gitGuardError) Error() string { return e.msg }

func refusedGit(code int, format string, args ...any) error {
	return &gitGuardError{code: code, msg: fmt.Sprintf(format, args...)}
}

// execFunc replaces the process with a program (syscall.Exec).
type execFunc func(path string, argv, env []string) error

// guardGit checks git with arguments args, for the guard in directory
// dir, and runs it with run; it returns only when git does not run.
func guardGit(dir string, args, environ []string, stderr io.Writer, run execFunc) error {
	data, err := os.ReadFile(dir + "/guard.json")
	if err != nil {
		return refusedGit(gitRefused, "reading its configuration: %v; restart the agent", err)
	}
	var cfg gitGuardConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return refusedGit(gitRefused, "its configuration %s/guard.json: %v; restart the agent", dir, err)
	}
	if cfg.Git == "" {
		return refusedGit(gitNotFound, "git was not found in PATH when the agent started; install it and restart the agent")
	}
	var deny gitGuardDeny
	if data, err = os.ReadFile(filepath.Join(dir, gitGuardDenyFile)); err == nil {
		err = json.Unmarshal(data, &deny)
	}
	if err != nil {
		return refusedGit(gitRefused, "reading its deny rules: %v; restart the agent", err)
	}
	rules, err := policy.NewGitRules(cfg.AllowConfig, deny.Deny)
	if err != nil {
		return refusedGit(gitRefused, "%v", err)
	}
	inv, err := rules.CheckArgs(args)
	if err != nil {
		return refusedGit(gitRefused, "%v", err)
	}
	// exec passes the environment as it is, and git reads the first of
	// two entries of a name: there must be one.
	env := setEnv(rules.Environ(environ), "GIT_EXEC_PATH", cfg.Mirror)
	list, err := gitOutput(cfg.Git, append(slices.Clip(inv.Repo), "config", "--list", "--show-scope", "--show-origin", "-z"), env, stderr)
	if err != nil {
		return err
	}
	entries, err := policy.ParseGitConfigList(list)
	if err != nil {
		return refusedGit(gitRefused, "reading git's configuration: %v", err)
	}
	if err := rules.CheckConfig(entries); err != nil {
		return refusedGit(gitRefused, "%v", err)
	}
	// git's commands are the programs in its program directory; a name
	// that is none of them may be an alias the configuration allows.
	isCommand := func(name string) bool {
		_, err := os.Lstat(filepath.Join(cfg.Mirror, "git-"+name))
		return err == nil && !strings.ContainsAny(name, "/\\")
	}
	if err := rules.CheckAlias(args, entries, isCommand); err != nil {
		return refusedGit(gitRefused, "%v", err)
	}
	if inv.Resumes {
		if err := checkGitTodos(cfg.Git, inv.Repo, env, stderr); err != nil {
			return err
		}
	}
	err = run(cfg.Git, append([]string{"git"}, args...), env)
	return refusedGit(gitRefused, "running %s: %v", cfg.Git, err)
}

// gitOutput runs git with args and returns what it prints. When git
// fails, what it said goes to stderr, and the error carries its status.
func gitOutput(git string, args, env []string, stderr io.Writer) ([]byte, error) {
	var out, errOut bytes.Buffer
	cmd := exec.Command(git, args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, &limitedBuffer{&out, maxGitConfigList}, &limitedBuffer{&errOut, 64 << 10}
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		stderr.Write(errOut.Bytes())
		return nil, &gitGuardError{code: max(ee.ExitCode(), 1)}
	case errors.Is(err, errTooLong):
		return nil, refusedGit(gitRefused, "git %s printed more than %d bytes, too much to check", strings.Join(args, " "), maxGitConfigList)
	case err != nil:
		return nil, refusedGit(gitRefused, "running %s: %v", git, err)
	}
	return out.Bytes(), nil
}

// checkGitTodos refuses to carry on with a paused rebase, cherry-pick or
// revert whose remaining steps run commands: someone who can write the
// repository may have put them there.
func checkGitTodos(git string, repo, env []string, stderr io.Writer) error {
	todos := []string{"rebase-merge/git-rebase-todo", "sequencer/todo"}
	args := append(slices.Clip(repo), "rev-parse", "--path-format=absolute")
	for _, t := range todos {
		args = append(args, "--git-path", t)
	}
	out, err := gitOutput(git, args, env, stderr)
	if err != nil {
		return err
	}
	paths := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(paths) != len(todos) {
		return refusedGit(gitRefused, "git rev-parse --git-path printed %q", out)
	}
	for _, p := range paths {
		data, err := readBounded(p, maxGitConfigList)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return refusedGit(gitRefused, "reading %s: %v", p, err)
		}
		if err := policy.CheckGitTodo(p, data); err != nil {
			return refusedGit(gitRefused, "%v", err)
		}
	}
	return nil
}

// readBounded reads at most limit bytes of the file at path; a longer
// file is an error.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err == nil && int64(len(data)) > limit {
		err = fmt.Errorf("more than %d bytes", limit)
	}
	return data, err
}

var errTooLong = errors.New("output too long")

// limitedBuffer is a writer that fails once more than n bytes were
// written to it.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if l.b.Len()+len(p) > l.n {
		return 0, errTooLong
	}
	return l.b.Write(p)
}
