//go:build unix

package agent

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// escape is a bash command line that, run by the shell, creates the file
// outside (or writes to it), which the host policy does not allow.
type escape struct {
	name, line, outside, want string
}

// runEscapes runs each escape under g's policy and checks that it is
// refused and its file was not created. Then, as a control, it runs the
// same line unrestricted in the same directory, and checks that the file
// is created there: the line does what the policy must stop.
func runEscapes(t *testing.T, g guarded, escapes []escape) {
	t.Helper()
	free := tbPolicyIn(t, "# unrestricted\n", "/bin/bash", g.home)
	free.cfg.Cwd = g.cwd
	for _, e := range escapes {
		r := run(t, g.toolbox, "bash", map[string]any{"command": e.line})
		wantDenied(t, e.name, r, e.want)
		if _, err := os.Lstat(e.outside); !os.IsNotExist(err) {
			t.Errorf("%s: %s was created (%v): the refused line ran", e.name, e.outside, err)
			continue
		}
		r = run(t, free.toolbox, "bash", map[string]any{"command": e.line})
		if _, err := os.Lstat(e.outside); err != nil {
			t.Errorf("%s: control: unrestricted, the line did not create %s (%v; %+v), so it proves nothing", e.name, e.outside, err, r)
		}
		os.Remove(e.outside)
	}
}

func mkdirs(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRedirectPhysical: redirection targets are checked where the kernel
// puts them. ".." after a link to a directory goes to the parent of the
// link's destination, so a target that is inside the allowed tree as text
// can be outside it on disk: chained, absolute or relative, through links
// to links, dangling links, doubled slashes and "/./", a trailing slash,
// and "~/".
func TestRedirectPhysical(t *testing.T) {
	home := t.TempDir()
	g := tbPolicyIn(t, `
bash: {allow: ["echo *", "cat *", "true"]}
paths: {write: {allow: ["CWD/work/**"]}}
`, "/bin/bash", home)
	work := filepath.Join(g.cwd, "work")
	mkdirs(t, filepath.Join(work, "a"), filepath.Join(work, "sub"))
	g.link(t, ".", "work/self")
	g.link(t, ".", "work/a/self")
	g.link(t, "l2", "work/l1")
	g.link(t, ".", "work/l2")
	g.link(t, "../esc-dangling", "work/dangling")
	g.link(t, "../sub", "work/a/up")
	outside := func(name string) string { return filepath.Join(g.cwd, name) }
	runEscapes(t, g, []escape{
		{"relative", "echo x > work/self/../esc1", outside("esc1"), "outside paths.write.allow"},
		{"absolute", "echo x > " + work + "/self/../esc2", outside("esc2"), "outside paths.write.allow"},
		{"chained", "echo x > work/a/self/self/../../esc3", outside("esc3"), "outside paths.write.allow"},
		{"link to a link", "echo x > work/l1/../esc4", outside("esc4"), "outside paths.write.allow"},
		{"dangling link", "echo x > work/dangling", outside("esc-dangling"), "outside paths.write.allow"},
		{"doubled slashes", "echo x > " + work + "//./self/.//../esc5", outside("esc5"), "outside paths.write.allow"},
		{"append", "echo x >> work/self/../esc6", outside("esc6"), "outside paths.write.allow"},
		{"both streams", "echo x &> work/self/../esc7", outside("esc7"), "outside paths.write.allow"},
		{">&", "echo x >& work/self/../esc8", outside("esc8"), "outside paths.write.allow"},
		{"in a subshell", "(echo x > work/self/../esc9)", outside("esc9"), "outside paths.write.allow"},
		{"read-write", "true <> work/self/../esc10", outside("esc10"), "outside paths.write.allow"},
	})
	// A trailing slash makes the kernel refuse to create a file, but the
	// target is still judged where it is.
	r := run(t, g.toolbox, "bash", map[string]any{"command": "echo x > work/self/../esc/"})
	wantDenied(t, "trailing slash", r, "outside paths.write.allow")
	// Near misses: links that stay inside.
	for _, line := range []string{"echo x > work/a/up/in1 && cat work/sub/in1", "echo x > work/self/self/in2 && cat work/in2",
		"echo x > work/a/up/../in3 && cat work/in3"} {
		r := run(t, g.toolbox, "bash", map[string]any{"command": line})
		if tbText(t, r) != "x\n" || r.IsError {
			t.Errorf("%s: %+v", line, r)
		}
	}

	// "~/": with no write rules, ~ is placed against the agent's own
	// files, which a link and ".." must not get around.
	h := tbPolicyIn(t, `bash: {allow: ["echo *"]}`, "/bin/bash", home)
	mkdirs(t, filepath.Join(h.state, "output", "x"))
	if err := os.Symlink(filepath.Join(h.state, "output", "x"), filepath.Join(home, "l")); err != nil {
		t.Fatal(err)
	}
	runEscapes(t, h, []escape{{"~/ through a link", "echo x > ~/l/../../escaped", filepath.Join(h.state, "escaped"), "its state directory"}})
}

// TestRedirectProcLinks: /proc/self/cwd, /proc/self/root, /dev/fd/N and
// the like name files of the shell, not of the agent: redirections
// through them are refused.
func TestRedirectProcLinks(t *testing.T) {
	g := tbPolicyIn(t, `
bash: {deny: ["rm *"]}
paths: {write: {deny: ["CWD/secret"]}}
`, "/bin/bash", "")
	secret := filepath.Join(g.cwd, "secret")
	mkdirs(t, secret)
	runEscapes(t, g, []escape{
		{"/proc/self/cwd", "echo x > /proc/self/cwd/secret/f1", filepath.Join(secret, "f1"), "link of /proc"},
		{"/proc/thread-self/cwd", "echo x > /proc/thread-self/cwd/secret/f2", filepath.Join(secret, "f2"), "link of /proc"},
		{"/proc/self/root", "echo x > /proc/self/root" + secret + "/f3", filepath.Join(secret, "f3"), "link of /proc"},
		{"/dev/fd/N of a directory", "exec 3< secret; echo x > /dev/fd/3/f4", filepath.Join(secret, "f4"), "link of /proc"},
		{"/proc/self/fd/N of a directory", "exec 3< secret; echo x > /proc/self/fd/3/f5", filepath.Join(secret, "f5"), "link of /proc"},
		{"/dev/fd/N and ..", "exec 3< secret/..; echo x > /dev/fd/3/secret/f6", filepath.Join(secret, "f6"), "link of /proc"},
	})
	r := run(t, g.toolbox, "bash", map[string]any{"command": "echo x > " + secret + "/f"})
	wantDenied(t, "the denied directory itself", r, "paths.write.deny")
	// A link to /proc/self/cwd inside the allowed tree.
	g.link(t, "/proc/self/cwd", "me")
	r = run(t, g.toolbox, "bash", map[string]any{"command": "echo x > me/secret/f"})
	wantDenied(t, "link to /proc/self/cwd", r, "link of /proc")
}

// TestRedirectCreatedPaths: ".." after a directory that does not exist
// yet means what the line makes of it, so it is refused.
func TestRedirectCreatedPaths(t *testing.T) {
	g := tbPolicyIn(t, `
bash: {allow: ["echo *", "mkdir *", "ln *"]}
paths: {write: {allow: ["CWD/work/**"]}}
`, "/bin/bash", "")
	mkdirs(t, filepath.Join(g.cwd, "work"))
	runEscapes(t, g, []escape{
		{"link made by the line", "mkdir -p work/new && ln -s .. work/new/up && echo x > work/new/up/../esc",
			filepath.Join(g.cwd, "esc"), "which does not exist"},
	})
	r := run(t, g.toolbox, "bash", map[string]any{"command": "mkdir -p work/out && echo x > work/out/f"})
	wantAllowed(t, "a directory the line creates", r)
}

// TestRedirectInput: input redirections are held to the read rules,
// resolved as the kernel resolves them, and /dev/tcp is refused under any
// restricted policy.
func TestRedirectInput(t *testing.T) {
	g := tbPolicyIn(t, `
bash: {allow: ["cat *", "echo *", "exec *", "wc *"]}
paths: {read: {allow: ["CWD/work/**"]}, deny: ["**/*.pem"]}
`, "/bin/bash", "")
	g.file(t, "work/ok.txt", "fine\n")
	g.file(t, "secret.txt", "TOPSECRET\n")
	g.file(t, "work/key.pem", "PEMSECRET\n")
	g.link(t, ".", "work/self")
	g.link(t, "../secret.txt", "work/leak")
	for _, tt := range []struct{ line, want string }{
		{"cat < secret.txt", "outside paths.read.allow"},
		{"cat < work/self/../secret.txt", "outside paths.read.allow"},
		{"cat < work/leak", "outside paths.read.allow"},
		{"cat < work/key.pem", `matches paths.deny "**/*.pem"`},
		{"cat 0< work/self/../secret.txt", "outside paths.read.allow"},
		{"exec 3< work/self/../secret.txt; cat <&3", "outside paths.read.allow"},
		{"exec {fd}< work/self/../secret.txt", "outside paths.read.allow"},
		{"cat <> work/self/../secret.txt", "outside paths.read.allow"},
		{"cat < " + g.secret, "its credentials"},
		{"cat < /proc/self/cwd/secret.txt", "link of /proc"},
		{`f=secret.txt; cat < "$f"`, "only known when the line runs"},
	} {
		r := run(t, g.toolbox, "bash", map[string]any{"command": tt.line})
		wantDenied(t, tt.line, r, tt.want)
		if r.Error == nil && strings.Contains(tbText(t, r), "SECRET") {
			t.Errorf("%s: the secret was read: %q", tt.line, tbText(t, r))
		}
	}
	r := run(t, g.toolbox, "bash", map[string]any{"command": "cat < work/ok.txt; wc -l < work/self/ok.txt"})
	if got := tbText(t, r); r.IsError || got != "fine\n1\n" {
		t.Errorf("allowed input redirections: %q (%+v)", got, r)
	}
}

// TestRedirectReopen: a descriptor opened for reading only cannot be
// reopened for writing through /dev/fd/N or /dev/stdout.
func TestRedirectReopen(t *testing.T) {
	g := tbPolicyIn(t, `
bash: {allow: ["cat *", "echo *", "exec *"]}
paths: {write: {allow: ["CWD/out/**"]}}
`, "/bin/bash", "")
	ro := g.file(t, "ro.txt", "original\n")
	for _, line := range []string{"exec 3< ro.txt; echo pwned > /dev/fd/3", "exec 1< ro.txt; echo pwned > /dev/stdout",
		"exec 0< ro.txt; echo pwned >> /dev/stdin"} {
		r := run(t, g.toolbox, "bash", map[string]any{"command": line})
		wantDenied(t, line, r, "reopens a descriptor")
		if data, _ := os.ReadFile(ro); string(data) != "original\n" {
			t.Fatalf("%s: ro.txt became %q", line, data)
		}
	}
	// The control: bash does write through /dev/fd/3.
	free := tbPolicyIn(t, "# unrestricted\n", "/bin/bash", "")
	free.cfg.Cwd = g.cwd
	run(t, free.toolbox, "bash", map[string]any{"command": "exec 3< ro.txt; echo pwned > /dev/fd/3"})
	if data, _ := os.ReadFile(ro); string(data) != "pwned\n" {
		t.Errorf("control: unrestricted, ro.txt is %q: the line proves nothing", data)
	}
}

// TestRedirectNetwork: /dev/tcp and /dev/udp are refused in every kind of
// redirection under a restricted policy, even one with deny rules only,
// and no connection is made.
func TestRedirectNetwork(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	tcp := "/dev/tcp/127.0.0.1/" + itoa(port)
	g := tbPolicyIn(t, `bash: {deny: ["rm *"]}`, "/bin/bash", "")
	lines := []string{
		"cat < " + tcp, "echo hi > " + tcp, "echo hi >> " + tcp, "echo hi &> " + tcp, "exec 3<>" + tcp,
		"exec {s}<>" + tcp, "(cat 0<" + tcp + ")", "bash -c 'echo hi > " + tcp + "'", "p=tcp; echo hi > /dev/$p/127.0.0.1/" + itoa(port),
	}
	for _, line := range lines {
		r := run(t, g.toolbox, "bash", map[string]any{"command": line})
		wantDenied(t, line, r, "network connections")
	}
	// Had any of them connected, its connection would be first in the
	// listen queue: the kernel queues them in order.
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("probe\n")); err != nil {
		t.Fatal(err)
	}
	first, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	line, _ := bufio.NewReader(first).ReadString('\n')
	if line != "probe\n" {
		t.Errorf("the first connection sent %q, not the probe: a refused line connected", line)
	}
}
