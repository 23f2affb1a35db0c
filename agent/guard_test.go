//go:build unix

package agent

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// guarded is a toolbox under a host policy, with the agent's own files.
type guarded struct {
	*toolbox
	cwd, state, policyFile, secret string
	home                           string
}

// tbPolicy returns a toolbox whose host policy is text, in which "CWD"
// stands for its working directory.
func tbPolicy(t testing.TB, text string) guarded {
	t.Helper()
	return tbPolicyIn(t, text, "/bin/sh", "")
}

// tbPolicyIn is tbPolicy with the given shell and home directory ("":
// none).
func tbPolicyIn(t testing.TB, text, shell, home string) guarded {
	t.Helper()
	cwd, own := t.TempDir(), t.TempDir()
	g := guarded{cwd: cwd, state: filepath.Join(own, "state"), policyFile: filepath.Join(own, "policy.yaml"), secret: filepath.Join(own, "password"), home: home}
	env := os.Environ()
	if home != "" {
		env = append(env, "HOME="+home) // the last one wins
	}
	text = strings.ReplaceAll(text, "CWD", cwd)
	for p, data := range map[string]string{g.policyFile: text, g.secret: "s3cret\n"} {
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pol, err := loadPolicy(g.policyFile, policy.Env{Cwd: cwd, Home: home, Tools: toolNames(), Shell: shell})
	if err != nil {
		t.Fatal(err)
	}
	g.toolbox, err = newToolbox(toolboxConfig{
		Cwd: cwd, StateDir: g.state, Home: home, Shell: shell, BashDefaultTimeout: 10 * time.Second, BashMaxTimeout: time.Minute,
		ChildEnv: env, Policy: pol, PolicyFile: g.policyFile, SecretFiles: []string{g.secret},
	})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// file creates dir/name with content and returns its path.
func (g guarded) file(t *testing.T, name, content string) string {
	t.Helper()
	return tbFile(t, g.cwd, name, content)
}

func (g guarded) link(t *testing.T, target, name string) string {
	t.Helper()
	p := filepath.Join(g.cwd, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantDenied checks that r is a refusal mentioning want.
func wantDenied(t *testing.T, what string, r *protocol.Result, want string) {
	t.Helper()
	if r.Error == nil || r.Error.Code != protocol.CodeDenied {
		t.Errorf("%s: %+v, want a %s error", what, r, protocol.CodeDenied)
		return
	}
	if !strings.Contains(r.Error.Message, want) {
		t.Errorf("%s: %q does not mention %q", what, r.Error.Message, want)
	}
}

func wantAllowed(t *testing.T, what string, r *protocol.Result) {
	t.Helper()
	if r.Error != nil || r.IsError {
		t.Errorf("%s: %+v, want success", what, r)
	}
}

func run(t *testing.T, tb *toolbox, tool string, args map[string]any) *protocol.Result {
	t.Helper()
	r, _ := tbCall(t, context.Background(), tb, tool, args)
	return r
}

// TestPolicyPaths: path rules hold against symlinks, "..", prefix
// siblings, /proc/self/root, names that are not UTF-8, and files that do
// not exist yet.
func TestPolicyPaths(t *testing.T) {
	g := tbPolicy(t, `paths: {allow: ["CWD/work/**"], deny: ["**/secret/**", "**/*.pem"]}`)
	outside := tbFile(t, t.TempDir(), "outside.txt", "outside\n")
	secret := g.file(t, "work/secret/key.txt", "key\n")
	g.file(t, "work/ok.txt", "ok\n")
	g.file(t, "work_evil/x.txt", "evil\n")
	g.file(t, "work/\xff\xfe.txt", "latin\n")
	g.link(t, outside, "work/out-link")
	g.link(t, filepath.Join(g.cwd, "work/secret"), "work/innocent")
	g.link(t, filepath.Join(g.cwd, "work/ok.txt"), "work/cert.pem")
	g.link(t, filepath.Join(g.cwd, "work/secret/\xff"), "work/latin-link")
	g.link(t, filepath.Dir(outside), "work/outdir")

	for _, tt := range []struct{ path, want string }{
		{"work/out-link", "outside paths.allow"},
		{"work/../work_evil/x.txt", "outside paths.allow"},
		{"work_evil/x.txt", "outside paths.allow"},
		{"work/innocent/key.txt", `matches paths.deny "**/secret/**"`},
		{secret, "paths.deny"},
		{"work/cert.pem", `matches paths.deny "**/*.pem"`},
		{"/proc/self/root" + secret, "paths.deny"},
		{"/proc/self/root" + outside, "outside paths.allow"},
		{"work/latin-link", "paths.deny"},
		{"work/outdir/outside.txt", "outside paths.allow"},
	} {
		wantDenied(t, "read "+tt.path, run(t, g.toolbox, "read", map[string]any{"path": tt.path}), tt.want)
		wantDenied(t, "write "+tt.path, run(t, g.toolbox, "write", map[string]any{"path": tt.path, "content": "x"}), tt.want)
		wantDenied(t, "edit "+tt.path, run(t, g.toolbox, "edit", map[string]any{"path": tt.path, "edits": edits("o", "0")}), tt.want)
	}
	if got := tbRead(t, outside); got != "outside\n" {
		t.Errorf("outside file changed to %q", got)
	}
	// A file that does not exist yet is placed by its nearest existing
	// parent: through a link out of the tree it is refused.
	wantDenied(t, "write a new file under a link", run(t, g.toolbox, "write", map[string]any{"path": "work/outdir/new/deep.txt", "content": "x"}), "outside paths.allow")
	if _, err := os.Stat(filepath.Join(filepath.Dir(outside), "new")); !os.IsNotExist(err) {
		t.Errorf("a refused write created a directory outside: %v", err)
	}

	wantAllowed(t, "read work/ok.txt", run(t, g.toolbox, "read", map[string]any{"path": "work/ok.txt"}))
	// JSON cannot carry a name that is not UTF-8, but a link can lead to
	// one.
	g.link(t, "\xff\xfe.txt", "work/latin-ok")
	wantAllowed(t, "read a name that is not UTF-8", run(t, g.toolbox, "read", map[string]any{"path": "work/latin-ok"}))
	wantAllowed(t, "write a new file in new directories", run(t, g.toolbox, "write", map[string]any{"path": "work/a/b/new.txt", "content": "new"}))
	wantAllowed(t, "edit", run(t, g.toolbox, "edit", map[string]any{"path": "work/ok.txt", "edits": edits("ok", "fine")}))
	if got := tbRead(t, filepath.Join(g.cwd, "work/ok.txt")); got != "fine\n" {
		t.Errorf("edited file = %q", got)
	}
}

// TestOwnFiles: whatever the policy says (here: nothing), the agent's own
// files are out of the tools' reach, except what they must read.
func TestOwnFiles(t *testing.T) {
	g := tbPolicy(t, "# unrestricted\n")
	outputs := filepath.Join(g.state, "output")
	if err := os.MkdirAll(outputs, 0o700); err != nil {
		t.Fatal(err)
	}
	spill := tbFile(t, outputs, "call-1.log", "full output\n")
	internal := tbFile(t, g.state, "tasks.json", "{}\n")
	g.link(t, g.state, "state-link")
	g.link(t, g.policyFile, "policy-link")
	hard := filepath.Join(g.cwd, "hard")
	if err := os.Link(g.secret, hard); err != nil {
		t.Fatal(err)
	}
	hardPolicy := filepath.Join(g.cwd, "hard-policy")
	if err := os.Link(g.policyFile, hardPolicy); err != nil {
		t.Fatal(err)
	}
	policyText := tbRead(t, g.policyFile)

	denied := []struct{ tool, path, want string }{
		{"write", g.policyFile, "its policy file"},
		{"edit", g.policyFile, "its policy file"},
		{"write", "policy-link", "its policy file"},
		{"write", "/proc/self/root" + g.policyFile, "its policy file"},
		{"read", g.secret, "its credentials"},
		{"write", g.secret, "its credentials"},
		{"read", hard, "credentials under another name"},
		{"edit", hard, "credentials under another name"},
		{"read", internal, "its state directory"},
		{"read", "state-link/tasks.json", "its state directory"},
		{"write", filepath.Join(g.state, "new.txt"), "its state directory"},
		{"write", spill, "its state directory"},
		{"write", "state-link/output/x.log", "its state directory"},
		{"edit", spill, "its state directory"},
		{"read", "/proc/self/environ", "its own process"},
		{"read", "/proc/thread-self/environ", "its own process"},
		{"read", "/proc/" + itoa(os.Getpid()) + "/cmdline", "its own process"},
	}
	for _, tt := range denied {
		args := map[string]any{"path": tt.path, "content": "x", "edits": edits("a", "b")}
		if tt.tool == "read" {
			args = map[string]any{"path": tt.path}
		} else if tt.tool == "write" {
			delete(args, "edits")
		} else {
			delete(args, "content")
		}
		wantDenied(t, tt.tool+" "+tt.path, run(t, g.toolbox, tt.tool, args), tt.want)
	}
	if got := tbRead(t, g.policyFile); got != policyText {
		t.Errorf("policy file changed to %q", got)
	}
	wantAllowed(t, "read the policy file", run(t, g.toolbox, "read", map[string]any{"path": g.policyFile}))
	wantAllowed(t, "read a full-output file", run(t, g.toolbox, "read", map[string]any{"path": spill}))
	// A write to a hard link replaces the link's name: the policy file
	// itself keeps its content.
	wantAllowed(t, "write the hard link to the policy file", run(t, g.toolbox, "write", map[string]any{"path": hardPolicy, "content": "tools: {deny: [bash]}\n"}))
	if got := tbRead(t, g.policyFile); got != policyText {
		t.Errorf("writing a hard link changed the policy file to %q", got)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestSwapAfterCheck: a symbolic link swapped in between the check and the
// use cannot redirect a read or a write.
func TestSwapAfterCheck(t *testing.T) {
	g := tbPolicy(t, `paths: {allow: ["CWD/**"]}`)
	outsideDir := t.TempDir()
	outside := tbFile(t, outsideDir, "f.txt", "outside\n")
	g.file(t, "dir/f.txt", "inside\n")
	path := filepath.Join(g.cwd, "dir/f.txt")

	swapDir := func() {
		if err := os.Rename(filepath.Join(g.cwd, "dir"), filepath.Join(g.cwd, "dir.old")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outsideDir, filepath.Join(g.cwd, "dir")); err != nil {
			t.Fatal(err)
		}
	}
	target, err := g.guard.checkPath(path, policy.Write)
	if err != nil {
		t.Fatal(err)
	}
	swapDir()
	if err := writeFileAtomic(target, []byte("swapped\n")); err == nil || !strings.Contains(err.Error(), "changed while it was being checked") {
		t.Errorf("write after a directory swap: %v", err)
	}
	if _, _, err := g.openText(path, target, "text only"); err == nil || !strings.Contains(err.Error(), "changed while it was being checked") {
		t.Errorf("read after a directory swap: %v", err)
	}
	if got := tbRead(t, outside); got != "outside\n" {
		t.Fatalf("the write went through the swapped link: %q", got)
	}

	// The last component swapped for a link: the write replaces the link,
	// never its target; the read refuses it.
	g.file(t, "last.txt", "inside\n")
	last := filepath.Join(g.cwd, "last.txt")
	target, err = g.guard.checkPath(last, policy.Write)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(last); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, last); err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.openText(last, target, "text only"); err == nil || !strings.Contains(err.Error(), "changed while it was being checked") {
		t.Errorf("read after the file became a link: %v", err)
	}
	if err := writeFileAtomic(target, []byte("new\n")); err == nil || !strings.Contains(err.Error(), "changed while it was being checked") {
		t.Errorf("write after the file became a link: %v", err)
	}
	if got := tbRead(t, outside); got != "outside\n" {
		t.Fatalf("the write went through the link: %q", got)
	}
}

// TestSwapRace writes while another goroutine keeps swapping a directory
// for a link out of the allowed tree: no write ever lands outside.
func TestSwapRace(t *testing.T) {
	g := tbPolicy(t, `paths: {allow: ["CWD/**"]}`)
	outsideDir := t.TempDir()
	outside := tbFile(t, outsideDir, "f.txt", "outside\n")
	g.file(t, "dir/f.txt", "inside\n")
	dir, parked := filepath.Join(g.cwd, "dir"), filepath.Join(g.cwd, "parked")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_ = os.Rename(dir, parked)
			_ = os.Symlink(outsideDir, dir)
			_ = os.Remove(dir)
			_ = os.Rename(parked, dir)
		}
	}()
	for i := range 300 {
		run(t, g.toolbox, "write", map[string]any{"path": "dir/f.txt", "content": "write " + itoa(i) + "\n"})
	}
	cancel()
	<-done
	if got := tbRead(t, outside); got != "outside\n" {
		t.Fatalf("a write landed outside the allowed tree: %q", got)
	}
}

// TestPolicyCommands: the bash tool refuses what the command rules refuse,
// before running anything, and output redirections are held to the path
// rules and the agent's own files.
func TestPolicyCommands(t *testing.T) {
	g := tbPolicy(t, `
bash: {allow: ["echo *", "cat *", "ls *", "true"], deny: ["cat *.pem"]}
paths: {write: {allow: ["CWD/**"]}}
`)
	marker := filepath.Join(g.cwd, "marker")
	for _, tt := range []struct{ line, want string }{
		{"touch " + marker, "not covered by bash.allow"},
		{"echo $(touch " + marker + ")", "command substitution"},
		{"ls; touch " + marker, "`touch " + marker + "`"},
		{"cat key.pem", `bash.deny "cat *.pem"`},
		{"echo x > /tmp/elsewhere", "outside paths.write.allow"},
		{"echo x > " + filepath.Join(g.state, "x"), "its state directory"},
		{"echo x >> " + g.policyFile, "its policy file"},
	} {
		r := run(t, g.toolbox, "bash", map[string]any{"command": tt.line})
		wantDenied(t, tt.line, r, tt.want)
		if !strings.HasPrefix(r.Error.Message, "denied") {
			t.Errorf("%s: refusal %q does not start with denied", tt.line, r.Error.Message)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("a refused command ran: %v", err)
	}
	r := run(t, g.toolbox, "bash", map[string]any{"command": "echo hi > out.txt && cat out.txt"})
	if tbText(t, r) != "hi\n" || r.IsError {
		t.Errorf("allowed command: %+v", r)
	}
}

// BenchmarkReadTool measures a 4 KiB read through the tool, unrestricted
// and under a policy with path rules: resolving the path, checking it and
// opening it component by component.
func BenchmarkReadTool(b *testing.B) {
	for _, bc := range []struct{ name, policy string }{
		{"unrestricted", "# none\n"},
		{"policy", `paths: {allow: ["CWD/**"], deny: ["**/.ssh/**", "*.pem", "**/.env"]}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			g := tbPolicy(b, bc.policy)
			tbFile(b, g.cwd, "src/pkg/file.txt", strings.Repeat("0123456789abcde\n", 256))
			args := []byte(`{"path":"src/pkg/file.txt"}`)
			b.ReportAllocs()
			for b.Loop() {
				r := g.read(context.Background(), &toolCall{ID: "c1", Args: args, Output: func([]byte) {}})
				if r.IsError || r.Error != nil {
					b.Fatalf("read: %+v", r)
				}
			}
		})
	}
}

// TestOwnFileNotMadeYetThroughLink: one of the agent's own files that
// does not exist yet, named through a directory link, is the agent's at
// the link's destination too: no tool may create it there.
func TestOwnFileNotMadeYetThroughLink(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	g, err := newGuard(nil, ownFiles{StateDir: t.TempDir(), SecretFiles: []string{filepath.Join(dir, "link", "creds.json")}})
	if err != nil {
		t.Fatal(err)
	}
	var own *ownError
	if _, err := g.checkPath(filepath.Join(real, "creds.json"), policy.Write); !errors.As(err, &own) {
		t.Errorf("write to the credentials' real place: %v, want a refusal", err)
	}
}

// Where file names compare without case and normalization (macOS), the
// agent's own paths are its own in every spelling: pathKey folds them as
// APFS does. (On Windows it folds them as NTFS does.)
func TestPathKeyFoldsAPFS(t *testing.T) {
	state := "/Users/josé/.local/state/fleetmcp-agent"
	for _, p := range []string{
		"/Users/josé/.LOCAL/State/FLEETMCP-agent/credentials.json",
		"/USERS/JOSÉ/.local/state/fleetmcp-agent",
		"/Users/jose\u0301/.local/state/fleetmcp-agent/tasks/x",
		"/Users/josé/.local/\u017Ftate/fleetmcp-agent",
	} {
		if !withinKey(pathKey(p, true), pathKey(state, true), "/") {
			t.Errorf("%+q is not within %q when names fold", p, state)
		}
		if withinKey(pathKey(p, false), pathKey(state, false), "/") && p != state {
			t.Errorf("%+q is within %q without folding", p, state)
		}
	}
	if withinKey(pathKey("/Users/josé/.local/state/fleetmcp-agent2", true), pathKey(state, true), "/") {
		t.Error("a sibling with a longer name is within the state directory")
	}
}
