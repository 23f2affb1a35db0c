//go:build unix

package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/policy"
)

// gitLab plants git repositories, as someone who can write files would,
// and runs git through the bash tool of a toolbox under a host policy.
type gitLab struct {
	t      *testing.T
	cwd    string // the agent's working directory
	home   string // HOME of the commands
	evil   string // a program that records that it ran, then copies its input
	marker string // where it records it
	env    []string
	// confine is the toolboxes' ConfineCommands; "": commands are not
	// confined.
	confine string
}

func newGitLab(t *testing.T) *gitLab {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	tools := t.TempDir()
	l := &gitLab{t: t, cwd: t.TempDir(), home: t.TempDir(), evil: filepath.Join(tools, "evil"), marker: filepath.Join(tools, "marker")}
	l.write(l.evil, "#!/bin/sh\necho \"ran $0 $*\" >> '"+l.marker+"'\nexec cat\n")
	if err := os.Chmod(l.evil, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !strings.HasPrefix(k, "GIT_") && k != "HOME" && k != "XDG_CONFIG_HOME" {
			l.env = append(l.env, kv)
		}
	}
	// The machine's own /etc/gitconfig stays out of the tests.
	l.env = append(l.env, "HOME="+l.home, "GIT_CONFIG_NOSYSTEM=1")
	return l
}

// write creates a file, relative paths in the working directory.
func (l *gitLab) write(path, content string) {
	l.t.Helper()
	if !filepath.IsAbs(path) {
		path = filepath.Join(l.cwd, path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		l.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		l.t.Fatal(err)
	}
}

// git runs the real git to set a repository up.
func (l *gitLab) git(dir string, args ...string) string {
	l.t.Helper()
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(l.cwd, dir)
	}
	cmd := exec.Command("git", append([]string{"-c", "protocol.file.allow=always"}, args...)...)
	cmd.Dir, cmd.Env = dir, append(l.env, "GIT_EDITOR=:", "GIT_SEQUENCE_EDITOR=:")
	out, err := cmd.CombinedOutput()
	if err != nil {
		l.t.Fatalf("git %q in %s: %v\n%s", args, dir, err, out)
	}
	return string(out)
}

// repo makes dir (relative to the working directory) a repository with
// one commit of a.txt.
func (l *gitLab) repo(dir string) {
	l.t.Helper()
	l.write(filepath.Join(dir, "a.txt"), "first line\n")
	l.git(dir, "init", "-q", "-b", "main")
	l.git(dir, "config", "user.name", "Test")
	l.git(dir, "config", "user.email", "test@example.com")
	l.git(dir, "add", "-A")
	l.git(dir, "commit", "-q", "-m", "first commit")
}

// profile returns a shipped host policy.
func (l *gitLab) profile(name string) string {
	l.t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "deploy", "policies", name))
	if err != nil {
		l.t.Fatal(err)
	}
	return string(data)
}

// toolbox returns a toolbox under the policy text that runs git through
// its guard, this test binary (see TestMain).
func (l *gitLab) toolbox(text string) *toolbox {
	l.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		l.t.Fatal(err)
	}
	p, err := policy.Parse([]byte(text), policy.Env{Cwd: l.cwd, Home: l.home, Tools: toolNames(), Shell: "/bin/bash", GitGuarded: true})
	if err != nil {
		l.t.Fatal(err)
	}
	cfg := toolboxConfig{Cwd: l.cwd, StateDir: filepath.Join(l.t.TempDir(), "state"), Shell: "/bin/bash",
		BashDefaultTimeout: time.Minute, BashMaxTimeout: time.Minute, Policy: p, GitGuard: exe, ChildEnv: l.env}
	if l.confine != "" {
		cfg.ConfineCommands, cfg.ConfineHelper = l.confine, exe
	}
	tb, err := newToolbox(cfg)
	if err != nil {
		l.t.Fatal(err)
	}
	return tb
}

// bash runs command with the bash tool and returns its output, or the
// message of its refusal, and whether it failed.
func (l *gitLab) bash(tb *toolbox, command string) (string, bool) {
	l.t.Helper()
	r, _ := tbCall(l.t, context.Background(), tb, "bash", map[string]any{"command": command})
	if r.Error != nil {
		return r.Error.Message, true
	}
	return tbText(l.t, r), r.IsError
}

// ran returns what the evil program recorded, and forgets it.
func (l *gitLab) ran() string {
	data, _ := os.ReadFile(l.marker)
	os.Remove(l.marker)
	return string(data)
}

// gitAttack is a way to make git run a program, and the command that
// would run it.
type gitAttack struct {
	name    string
	profile string // a shipped profile, or policy text
	setup   func(l *gitLab, tb *toolbox)
	command string // EVIL stands for the program
	// want is in the output; wantErr: the command fails.
	want    string
	wantErr bool
}

// TestGitGuardAttacks plants repositories whose configuration names a
// program and runs the git commands a policy allows: the program never
// runs, and the output says why when git does not run.
func TestGitGuardAttacks(t *testing.T) { gitGuardAttacks(t, "") }

// gitGuardAttacks runs the attacks with commands confined as mode says.
func gitGuardAttacks(t *testing.T, mode string) {
	for _, a := range gitAttacks() {
		t.Run(a.name, func(t *testing.T) {
			l := newGitLab(t)
			l.confine = mode
			text := a.profile
			if strings.HasSuffix(text, ".yaml") {
				text = l.profile(text)
			}
			tb := l.toolbox(text)
			a.setup(l, tb)
			l.ran()
			out, isErr := l.bash(tb, strings.ReplaceAll(a.command, "EVIL", l.evil))
			t.Logf("%s:\n%s", a.command, out)
			if ran := l.ran(); ran != "" {
				t.Errorf("%s ran the repository's program: %s\noutput: %s", a.command, ran, out)
			}
			if isErr != a.wantErr || !strings.Contains(out, a.want) {
				t.Errorf("%s: error %v, output:\n%s\nwant error %v and %q in it", a.command, isErr, out, a.wantErr, a.want)
			}
		})
	}
}

func gitAttacks() []gitAttack {
	config := func(dir string, kv ...string) func(*gitLab, *toolbox) {
		return func(l *gitLab, _ *toolbox) {
			l.repo(dir)
			for i := 0; i < len(kv); i += 2 {
				l.git(dir, "config", kv[i], strings.ReplaceAll(kv[i+1], "EVIL", l.evil))
			}
		}
	}
	attributes := func(attr string, kv ...string) func(*gitLab, *toolbox) {
		return func(l *gitLab, tb *toolbox) {
			config(".", kv...)(l, tb)
			l.write(".gitattributes", "*.txt "+attr+"\n")
			l.git(".", "add", ".gitattributes")
			l.git(".", "-c", "diff.evil.textconv=cat", "commit", "-q", "-m", "attributes")
			l.write("a.txt", "first line\nsecond line\n")
		}
	}
	return []gitAttack{
		{"fsmonitor", "read-only.yaml", config(".", "core.fsmonitor", "EVIL"), "git status",
			"core.fsmonitor = `" /* the path follows */, true},
		{"fsmonitor, git -C", "workspace.yaml", config("sub", "core.fsmonitor", "EVIL"), "git -C sub status --short",
			"from its local configuration", true},
		{"clean filter", "read-only.yaml", attributes("filter=evil", "filter.evil.clean", "EVIL"), "git status",
			"filter.evil.clean", true},
		{"textconv, git diff", "read-only.yaml", attributes("diff=evil", "diff.evil.textconv", "EVIL"), "git diff",
			"diff.evil.textconv", true},
		{"textconv, git log -p", "read-only.yaml", attributes("diff=evil", "diff.evil.textconv", "EVIL"), "git log -p",
			"diff.evil.textconv", true},
		{"textconv, git show", "read-only.yaml", attributes("diff=evil", "diff.evil.textconv", "EVIL"), "git show HEAD",
			"diff.evil.textconv", true},
		{"external diff", "read-only.yaml", config(".", "diff.external", "EVIL"), "git diff HEAD~0",
			"diff.external", true},
		{"alias", "workspace.yaml", config(".", "alias.st", "!EVIL"), "git st",
			`bash.git.allow_config: ["local:alias.st"]`, true},
		{"include.path", "read-only.yaml", func(l *gitLab, tb *toolbox) {
			l.write(filepath.Join(l.home, "extra.cfg"), "[core]\n\tfsmonitor = "+l.evil+"\n")
			config(".", "include.path", filepath.Join(l.home, "extra.cfg"))(l, tb)
		}, "git status", "extra.cfg", true},
		{"includeIf", "read-only.yaml", func(l *gitLab, tb *toolbox) {
			l.write(filepath.Join(l.home, "branch.cfg"), "[filter \"evil\"]\n\tclean = "+l.evil+"\n")
			attributes("filter=evil", "includeIf.onbranch:main.path", filepath.Join(l.home, "branch.cfg"))(l, tb)
		}, "git status", "filter.evil.clean", true},
		{"global configuration", "read-only.yaml", func(l *gitLab, tb *toolbox) {
			l.repo(".")
			l.write(filepath.Join(l.home, ".gitconfig"), "[core]\n\tfsmonitor = "+l.evil+"\n")
		}, "git status", "from its global configuration", true},
		{"pager on a terminal", `bash: {allow: ["git *", "script *"]}`, config(".", "core.pager", "EVIL", "pager.log", "EVIL"),
			"script -qec 'git log' /dev/null", "first commit", false},
		{"hook", "workspace.yaml", func(l *gitLab, tb *toolbox) {
			l.repo(".")
			l.write(".git/hooks/pre-commit", "#!/bin/sh\n"+l.evil+"\n")
			os.Chmod(filepath.Join(l.cwd, ".git/hooks/pre-commit"), 0o755)
		}, "git commit -q --allow-empty -m second && git log --oneline", "second", false},
		{"hooksPath", "workspace.yaml", func(l *gitLab, tb *toolbox) {
			config(".", "core.hooksPath", "hooks")(l, tb)
			l.write("hooks/pre-commit", "#!/bin/sh\n"+l.evil+"\n")
			os.Chmod(filepath.Join(l.cwd, "hooks/pre-commit"), 0o755)
		}, "git commit -q --allow-empty -m second && git log --oneline", "second", false},
		{"git directory written with the file tools", "workspace.yaml", func(l *gitLab, tb *toolbox) {
			l.repo(".")
			for name, content := range map[string]string{
				"x/HEAD":             "ref: refs/heads/main\n",
				"x/config":           "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\tworktree = ..\n\tfsmonitor = " + l.evil + "\n",
				"x/objects/.keep":    "",
				"x/refs/heads/.keep": "",
			} {
				r, _ := tbCall(l.t, context.Background(), tb, "write", map[string]any{"path": name, "content": content})
				if r.IsError || r.Error != nil {
					l.t.Fatalf("write %s: %+v", name, r)
				}
			}
		}, "git --git-dir=x status", "core.fsmonitor", true},
		{"bare repository in a subdirectory", "workspace.yaml", func(l *gitLab, tb *toolbox) {
			l.git(l.cwd, "init", "-q", "--bare", "b")
			l.git("b", "config", "alias.l", "!"+l.evil)
		}, "git -C b l; git -C b log", "cannot use bare repository", true},
		{"paused rebase carrying on with a command", "workspace.yaml", func(l *gitLab, tb *toolbox) {
			l.repo(".")
			l.git(".", "commit", "-q", "--allow-empty", "-m", "second")
			cmd := exec.Command("git", "rebase", "-q", "-i", "-x", "false", "HEAD~1")
			cmd.Dir, cmd.Env = l.cwd, append(l.env, "GIT_SEQUENCE_EDITOR=:")
			if out, err := cmd.CombinedOutput(); err == nil {
				l.t.Fatalf("the rebase did not stop: %s", out)
			}
			todo := filepath.Join(l.cwd, ".git", "rebase-merge", "git-rebase-todo")
			f, err := os.OpenFile(todo, os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				l.t.Fatal(err)
			}
			f.WriteString("exec " + l.evil + "\n")
			f.Close()
		}, "git rebase --continue", "runs a command", true},
		{"submodule", "read-only.yaml", func(l *gitLab, tb *toolbox) {
			lib := filepath.Join(l.home, "lib")
			l.repo(lib)
			l.repo(".")
			l.git(".", "submodule", "add", "-q", lib, "lib")
			l.git(".", "commit", "-q", "-m", "submodule")
			l.git(".", "config", "-f", ".git/modules/lib/config", "filter.evil.clean", l.evil)
			l.write("lib/.gitattributes", "*.txt filter=evil\n")
			l.write("lib/a.txt", "changed\n")
		}, "git status", "filter.evil.clean", true},
		{"configuration on the command line", `bash: {allow: ["git *"]}`, config("."), "git -c core.fsmonitor=EVIL status",
			"core.fsmonitor", true},
		{"git by its path", "workspace.yaml", config("."), "/usr/bin/git status", "run git by its name", true},
		// What the line only knows when it runs, the guard sees.
		{"configuration from a variable", `bash: {allow: ["git *"]}`, config("."), `c=core.fsmonitor=EVIL; git -c "$c" status`,
			"core.fsmonitor", true},
		{"upload-pack from a variable", `bash: {allow: ["git *"]}`, config("."), `u=--upload-pack=EVIL; git fetch "$u" .`,
			"runs a program", true},
		// git's own helpers run what they are given.
		{"submodule--helper foreach", "workspace.yaml", submodule, "git submodule--helper foreach EVIL", "foreach", true},
		{"submodule--helper foreach from a variable", `bash: {allow: ["git *"]}`, submodule, `h=submodule--helper; git "$h" foreach EVIL`,
			"submodule--helper foreach runs the command", true},
		{"bisect--helper run", "workspace.yaml", config("."), "git bisect--helper run EVIL", "bisect run", true},
		{"merge-index", "workspace.yaml", config("."), "git merge-index EVIL -a", "merge-index", true},
		{"remote-ext", `bash: {allow: ["git *"]}`, config("."), "git remote-ext origin EVIL </dev/null", "remote-ext", true},
		// A key the operator allows for files is not the caller's to set.
		{"filter the operator allows, set with -c", lfsPolicy, attributes("filter=lfs"), "git -c filter.lfs.clean=EVIL status",
			`"command:filter.lfs.clean"`, true},
		{"filter the operator allows, set with -c from a variable", lfsPolicy, attributes("filter=lfs"),
			`c=filter.lfs.clean=EVIL; git -c "$c" status`, `"command:filter.lfs.clean"`, true},
		{"filter the operator allows, written by git config", lfsPolicy, attributes("filter=lfs"),
			`k=filter.lfs.clean; git config "$k" EVIL && git status`, "git config sets only keys", true},
		{"alias written by git config", `bash: {allow: ["git *"]}`, config("."), `k=alias.st; git config "$k" '!EVIL' && git st`,
			"git config sets only keys", true},
	}
}

// lfsPolicy allows git-lfs's filter in the configuration files.
const lfsPolicy = `bash: {allow: ["git *"], git: {allow_config: ["filter.lfs.*"]}}`

// submodule sets up a repository with a submodule.
func submodule(l *gitLab, _ *toolbox) {
	lib := filepath.Join(l.home, "lib")
	l.repo(lib)
	l.repo(".")
	l.git(".", "submodule", "add", "-q", lib, "lib")
	l.git(".", "commit", "-q", "-m", "submodule")
}

// A deny rule holds for every git process: git run by make, by a script
// or by git itself is checked against it by the guard, with or without
// git's global options, however the command line that started it reads.
func TestGitGuardDenyThroughWrappers(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	l := newGitLab(t)
	remote := filepath.Join(l.home, "remote.git")
	l.git(l.home, "init", "-q", "--bare", remote)
	l.repo(".")
	l.git(".", "remote", "add", "origin", remote)
	l.write("Makefile", "push:\n\tgit push origin main\n"+
		"global:\n\tgit -C . --no-pager -c color.ui=never push origin main\n"+
		"script:\n\tsh ./push.sh\n"+
		"each:\n\tgit -c maintenance.repo=$(CURDIR) for-each-repo --config=maintenance.repo push origin main\n")
	l.write("push.sh", "#!/bin/sh\nexec git push origin HEAD:refs/heads/main\n")
	tb := l.toolbox(l.profile("workspace.yaml"))
	for _, target := range []string{"push", "global", "script", "each"} {
		out, isErr := l.bash(tb, "make "+target)
		if !isErr || !strings.Contains(out, "git guard: denied by host policy") || !strings.Contains(out, `matches bash.deny "git `) {
			t.Errorf("make %s: error %v, output:\n%s\nwant the guard to refuse git push", target, isErr, out)
		}
		if refs := l.git(remote, "for-each-ref"); refs != "" {
			t.Fatalf("make %s pushed: the remote has %s", target, refs)
		}
	}
	// The same command line without the deny rule pushes.
	tb = l.toolbox(`bash: {allow: ["make *", "git *"]}`)
	if out, isErr := l.bash(tb, "make push"); isErr || !strings.Contains(l.git(remote, "for-each-ref"), "refs/heads/main") {
		t.Errorf("make push without a deny rule: error %v, output:\n%s", isErr, out)
	}
}

// A reload gives the guard the new policy's deny rules: git is held to
// them from then on, in every process.
func TestGitGuardReload(t *testing.T) {
	l := newGitLab(t)
	l.repo(".")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "policy.yaml")
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("bash: {allow: [\"git *\"], deny: [\"git tag *\"]}\n")
	a, err := New(Config{Servers: []string{"nats://127.0.0.1:1"}, Name: "gr-1", StateDir: t.TempDir(), Cwd: l.cwd,
		PolicyFile: file, GitGuard: exe, Shell: "/bin/bash"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	tag := func() error {
		var stderr bytes.Buffer
		run := func(string, []string, []string) error { return errors.New("ran git") }
		return guardGit(filepath.Dir(a.gitGuard.bin), []string{"-C", l.cwd, "tag", "v1"}, l.env, &stderr, run)
	}
	if err := tag(); err == nil || !strings.Contains(err.Error(), `bash.deny "git tag *"`) {
		t.Fatalf("git tag before the reload: %v", err)
	}
	write("bash: {allow: [\"git *\"], deny: [\"git branch *\"]}\n")
	if err := a.Reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if err := tag(); err == nil || !strings.Contains(err.Error(), "ran git") {
		t.Errorf("git tag after a reload that allows it: %v", err)
	}
}

// Under the read-only profile git only looks: git status does not
// refresh the index on disk (GIT_OPTIONAL_LOCKS=0), nor does git diff
// (diff.autoRefreshIndex=false), nor the other commands the profile
// allows.
func TestGitGuardReadOnlyLeavesIndex(t *testing.T) {
	l := newGitLab(t)
	l.repo(".")
	// A file whose time changed but whose content did not: git status
	// would write the index to record its new time.
	l.write("a.txt", "first line\n")
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(l.cwd, "a.txt"), later, later); err != nil {
		t.Fatal(err)
	}
	index := filepath.Join(l.cwd, ".git", "index")
	before, err := os.ReadFile(index)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(index)
	tb := l.toolbox(l.profile("read-only.yaml"))
	for _, command := range []string{"git status", "git status --short", "git diff", "git log -p", "git show", "git blame a.txt"} {
		if out, isErr := l.bash(tb, command); isErr {
			t.Fatalf("%s: %s", command, out)
		}
		after, err := os.ReadFile(index)
		now, _ := os.Stat(index)
		if err != nil || !bytes.Equal(before, after) || !now.ModTime().Equal(fi.ModTime()) {
			t.Errorf("%s wrote .git/index (%v)", command, err)
		}
	}
}

// Ordinary work with git goes on as before under the guard.
func TestGitGuardOrdinaryUse(t *testing.T) { gitGuardOrdinaryUse(t, "") }

// gitGuardOrdinaryUse runs ordinary git commands with commands confined
// as mode says.
func gitGuardOrdinaryUse(t *testing.T, mode string) {
	l := newGitLab(t)
	l.confine = mode
	l.repo(".")
	l.git(".", "remote", "add", "origin", "https://example.com/repo.git")
	l.git(".", "config", "branch.main.remote", "origin")
	l.git(".", "config", "branch.main.merge", "refs/heads/main")
	l.write(filepath.Join(l.home, ".gitconfig"), "[color]\n\tui = never\n[core]\n\tpager = less\n\teditor = vim\n[credential]\n\thelper = store\n")
	l.write("a.txt", "first line\nsecond line\n")
	tb := l.toolbox(l.profile("read-only.yaml"))
	for _, tt := range []struct{ command, want string }{
		{"git status --short", " M a.txt"},
		{"git log --oneline", "first commit"},
		{"git diff", "+second line"},
		{"git show --stat HEAD", "a.txt | 1 +"},
		{"git blame a.txt", "first line"},
		{"git log -p --oneline -1", "+first line"},
		{"git status --porcelain=v2 --branch", "# branch.head main"},
	} {
		out, isErr, _ := tbBash(t, tb, map[string]any{"command": tt.command})
		if isErr || !strings.Contains(out, tt.want) {
			t.Errorf("%s: error %v, output:\n%s\nwant %q", tt.command, isErr, out, tt.want)
		}
	}
	if ran := l.ran(); ran != "" {
		t.Errorf("something ran: %s", ran)
	}
}

// go build asks git about the repository to stamp the binary: under the
// CI runner's profile that git goes through the guard too.
func TestGitGuardGoBuild(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go is not installed")
	}
	cache, err := exec.Command(gobin, "env", "GOCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	l := newGitLab(t)
	l.env = append(l.env, "GOCACHE="+strings.TrimSpace(string(cache)), "GOTOOLCHAIN=local", "GOFLAGS=")
	l.write("go.mod", "module example.com/stamped\n\ngo 1.21\n")
	l.write("main.go", "package main\n\nfunc main() {}\n")
	l.repo(".")
	l.git(".", "config", "core.fsmonitor", l.evil)
	tb := l.toolbox(l.profile("ci-runner.yaml"))
	out, isErr := l.bash(tb, "go build -o bin/stamped .")
	if ran := l.ran(); ran != "" {
		t.Errorf("go build ran the repository's program: %s\noutput: %s", ran, out)
	}
	// go does not show what git said, only its status.
	if !isErr || !strings.Contains(out, "error obtaining VCS status: exit status 126") {
		t.Errorf("go build: error %v, output:\n%s\nwant it to fail on git's exit status 126", isErr, out)
	}
	// Without the setting, the binary is built and stamped.
	l.git(".", "config", "--unset", "core.fsmonitor")
	if out, isErr := l.bash(tb, "go build -o bin/stamped ."); isErr {
		t.Fatalf("go build in a plain repository: %s", out)
	}
	info, err := exec.Command(gobin, "version", "-m", filepath.Join(l.cwd, "bin", "stamped")).Output()
	if err != nil || !strings.Contains(string(info), "vcs.revision=") {
		t.Errorf("the binary is not stamped (%v):\n%s", err, info)
	}
}

// A background task runs git through the guard as bash does.
func TestGitGuardBackgroundTask(t *testing.T) {
	l := newGitLab(t)
	l.repo(".")
	l.git(".", "config", "alias.st", "!"+l.evil)
	tb := l.toolbox(l.profile("workspace.yaml"))
	if err := tb.tasks.Open(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tb.tasks.Close()
		killTaskGroups(tb.tasks)
	})
	id := startTask(t, tb, "git st", nil)
	var text string
	for deadline := time.Now().Add(time.Minute); ; {
		r, v := taskCall(t, tb, "task_status", map[string]any{"task_id": id, "wait": 10})
		if text = resultTextOf(r); v.State.Ended() || time.Now().After(deadline) {
			break
		}
	}
	if ran := l.ran(); ran != "" || !strings.Contains(text, "alias.st") {
		t.Errorf("task ran %q; status:\n%s", ran, text)
	}
}

// The guard's directory: a git that runs the guard first in PATH, and a
// copy of git's program directory in which git is the guard too. It is
// found again, and mended, by the next agent on the same state directory.
func TestGitGuardInstall(t *testing.T) {
	l := newGitLab(t)
	tb := l.toolbox("bash: {allow: [\"git *\", \"type *\"]}")
	var path, execPath string
	for _, kv := range tb.env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
		if v, ok := strings.CutPrefix(kv, "GIT_EXEC_PATH="); ok {
			execPath = v
		}
	}
	bin := filepath.SplitList(path)[0]
	dir := filepath.Dir(bin)
	shim := filepath.Join(bin, "git")
	if !isGitShim(shim) || filepath.Join(dir, "exec") != execPath {
		t.Fatalf("PATH %s, GIT_EXEC_PATH %s", path, execPath)
	}
	if target, err := os.Readlink(filepath.Join(execPath, "git")); err != nil || target != filepath.Join("..", "bin", "git") {
		t.Errorf("the copy's git is %q (%v), not the guard", target, err)
	}
	real, err := exec.Command("git", "--exec-path").Output()
	if err != nil {
		t.Fatal(err)
	}
	upload := filepath.Join(strings.TrimSpace(string(real)), "git-upload-pack")
	if target, err := os.Readlink(filepath.Join(execPath, "git-upload-pack")); err != nil || target != upload {
		t.Errorf("the copy's git-upload-pack is %q (%v), want %s", target, err, upload)
	}
	if out, isErr := l.bash(tb, "git --exec-path; type -p git"); isErr || out != execPath+"\n"+shim+"\n" {
		t.Errorf("git --exec-path; type -p git = %q", out)
	}

	// A changed guard is mended in place; a second agent finds the same
	// directory.
	if err := os.WriteFile(shim, []byte("#!/bin/sh\nexec /usr/bin/git \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(execPath, "git-upload-pack")); err != nil {
		t.Fatal(err)
	}
	again, err := installGitGuard(tb.cfg.GitGuard, tb.cfg.StateDir, l.env, tb.cfg.Policy.GitRules())
	if err != nil {
		t.Fatal(err)
	}
	if again.bin != bin || !isGitShim(shim) {
		t.Errorf("second install: %s, shim mended %v", again.bin, isGitShim(shim))
	}
	if _, err := os.Readlink(filepath.Join(execPath, "git-upload-pack")); err != nil {
		t.Errorf("the copy's git-upload-pack is not restored: %v", err)
	}
	// An agent started from a guarded shell finds the real git behind
	// the guard.
	if got := findGit(bin + string(filepath.ListSeparator) + os.Getenv("PATH")); got == "" || isGitShim(got) {
		t.Errorf("findGit behind a guard = %q", got)
	}
}

func TestGitGuardMisconfigured(t *testing.T) {
	l := newGitLab(t)
	p, err := policy.Parse([]byte("bash: {allow: [\"git *\"]}"), policy.Env{Cwd: l.cwd, Tools: toolNames(), Shell: "/bin/bash", GitGuarded: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := toolboxConfig{Cwd: l.cwd, StateDir: filepath.Join(t.TempDir(), "state"), Shell: "/bin/bash",
		BashDefaultTimeout: time.Minute, BashMaxTimeout: time.Minute, Policy: p, ChildEnv: l.env}
	if _, err := newToolbox(cfg); err == nil || !strings.Contains(err.Error(), "no executable runs the guard") {
		t.Errorf("no GitGuard: %v", err)
	}
	cfg.GitGuard = "/bin/true"
	if _, err := newToolbox(cfg); err == nil || !strings.Contains(err.Error(), "does not run it") {
		t.Errorf("GitGuard /bin/true: %v", err)
	}
	// Without git in PATH, git is the guard, which says so.
	exe, _ := os.Executable()
	cfg.GitGuard, cfg.ChildEnv = exe, []string{"PATH=/nonexistent", "HOME=" + l.home}
	tb, err := newToolbox(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if out, isErr := l.bash(tb, "git status"); !isErr || !strings.Contains(out, "git was not found") || !strings.Contains(out, "code 127") {
		t.Errorf("git status without git: error %v, %s", isErr, out)
	}
}

// The startup log says how git runs under command rules.
func TestGitGuardLog(t *testing.T) {
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("bash: {allow: [\"git *\"], git: {allow_config: [\"filter.lfs.*\"]}}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		guard string
		want  []string
	}{
		{exe, []string{"bash: allow git *; git may also run with filter.lfs.*", "git runs through the agent's git guard"}},
		{"", []string{"level=WARN", "git is refused: this agent has no executable to run its git guard"}},
	} {
		var buf bytes.Buffer
		a := newTestAgent(t, Config{PolicyFile: file, GitGuard: tt.guard})
		a.log = slog.New(slog.NewTextHandler(&buf, nil))
		a.logPolicy()
		for _, w := range tt.want {
			if !strings.Contains(buf.String(), w) {
				t.Errorf("guard %q: the log does not mention %q:\n%s", tt.guard, w, buf.String())
			}
		}
	}
}

// The guard runs git with one value for each variable it sets, whatever
// the environment it was given (a Makefile may set GIT_EXEC_PATH): exec
// passes duplicates on, and git reads the first.
func TestGuardGitEnvironment(t *testing.T) {
	l := newGitLab(t)
	l.repo(".")
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	l.write(filepath.Join(dir, "guard.json"), `{"git": "`+real+`", "mirror": "/guard/exec", "allow_config": []}`)
	l.write(filepath.Join(dir, "deny.json"), `{"deny": ["git push *"]}`)
	environ := append(l.env, "GIT_EXEC_PATH=/tmp/evil", "GIT_PAGER=less", "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=user.name",
		"GIT_CONFIG_VALUE_0=x")
	var gotPath string
	var gotArgv, gotEnv []string
	run := func(path string, argv, env []string) error {
		gotPath, gotArgv, gotEnv = path, argv, env
		return errors.New("not this time")
	}
	var stderr bytes.Buffer
	err = guardGit(dir, []string{"-C", l.cwd, "log", "--oneline"}, environ, &stderr, run)
	if err == nil || !strings.Contains(err.Error(), "not this time") {
		t.Fatalf("guardGit = %v; stderr %s", err, stderr.String())
	}
	if gotPath != real || strings.Join(gotArgv, " ") != "git -C "+l.cwd+" log --oneline" {
		t.Errorf("ran %s %q", gotPath, gotArgv)
	}
	seen := map[string]string{}
	for _, kv := range gotEnv {
		k, v, _ := strings.Cut(kv, "=")
		if old, dup := seen[k]; dup {
			t.Errorf("%s given twice (%s, %s)", k, old, v)
		}
		seen[k] = v
	}
	if seen["GIT_EXEC_PATH"] != "/guard/exec" || seen["GIT_PAGER"] != "cat" || seen["GIT_CONFIG_KEY_0"] != "user.name" ||
		seen["GIT_OPTIONAL_LOCKS"] != "0" {
		t.Errorf("environment: %q", gotEnv)
	}
	// The deny rules of deny.json hold for git however it is run.
	if err := guardGit(dir, []string{"-C", l.cwd, "push", "origin"}, environ, &stderr, run); err == nil || !strings.Contains(err.Error(), `bash.deny "git push *"`) {
		t.Errorf("git push under a deny rule: %v", err)
	}
	// A setting from the environment is checked like one from -c.
	environ = append(environ, "GIT_CONFIG_COUNT=1", "GIT_CONFIG_KEY_0=alias.x", "GIT_CONFIG_VALUE_0=!id")
	if err := guardGit(dir, []string{"-C", l.cwd, "x"}, environ, &stderr, run); err == nil || !strings.Contains(err.Error(), "alias.x") {
		t.Errorf("alias from GIT_CONFIG_*: %v", err)
	}
}
