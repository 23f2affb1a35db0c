//go:build unix

package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// tbLink makes a symbolic link at dir/name to target.
func tbLink(t *testing.T, dir, name, target string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// listOf decodes a list result's structured listing.
func listOf(t *testing.T, r *protocol.Result) listing {
	t.Helper()
	if r.Error != nil || r.IsError {
		t.Fatalf("list failed: %+v", r)
	}
	var l listing
	if err := json.Unmarshal(r.Structured, &l); err != nil {
		t.Fatalf("structured listing %s: %v", r.Structured, err)
	}
	return l
}

func entryPaths(l listing) []string {
	var out []string
	for _, e := range l.Entries {
		out = append(out, e.Path)
	}
	return out
}

func TestList(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	tbFile(t, dir, "README.md", strings.Repeat("x", 2048))
	tbFile(t, dir, "cmd/agent/main.go", "package main\n")
	tbFile(t, dir, "cmd/agent/deep/x.go", "package deep\n")
	tbFile(t, dir, "cmd-tool.txt", "")
	tbLink(t, dir, "bin", "/usr/bin")
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}

	r, _ := tbCall(t, context.Background(), tb, "list", map[string]any{})
	want := dir + ` (7 entries, depth 2)
README.md  2.0KB
bin -> /usr/bin
cmd/
cmd/agent/
cmd-tool.txt  0B
empty/
pipe  [named pipe]

[1 directory at depth 2 not expanded; list one of them, or give a larger depth (at most 10).]`
	tbWant(t, r, false, want)
	l := listOf(t, r)
	if l.Path != dir || l.Depth != 2 || l.Truncated || l.Hidden != 0 || l.Unexpanded != 1 {
		t.Errorf("listing = %+v", l)
	}
	byPath := map[string]listEntry{}
	for _, e := range l.Entries {
		byPath[e.Path] = e
	}
	if e := byPath["README.md"]; e.Type != "file" || e.Size != 2048 {
		t.Errorf("README.md = %+v", e)
	}
	if e := byPath["bin"]; e.Type != "symlink" || e.Target != "/usr/bin" {
		t.Errorf("bin = %+v", e)
	}
	if e := byPath["pipe"]; e.Type != "other" || e.Kind != "named pipe" {
		t.Errorf("pipe = %+v", e)
	}
	if e := byPath["cmd/agent"]; e.Type != "dir" {
		t.Errorf("cmd/agent = %+v", e)
	}

	// A relative path, a deeper depth, and a listing that is complete.
	r, _ = tbCall(t, context.Background(), tb, "list", map[string]any{"path": "cmd", "depth": 3})
	tbWant(t, r, false, filepath.Join(dir, "cmd")+` (4 entries, depth 3)
agent/
agent/deep/
agent/deep/x.go  13B
agent/main.go  13B`)
	r, _ = tbCall(t, context.Background(), tb, "list", map[string]any{"path": "empty"})
	tbWant(t, r, false, filepath.Join(dir, "empty")+" (0 entries, depth 2)\n(empty directory)")
}

func TestListDepth(t *testing.T) {
	tb := tbNew(t)
	deep := "a/b/c/d/e/f/g/h/i/j/k/l"
	tbFile(t, tb.cfg.Cwd, deep+"/leaf.txt", "x")
	for depth := 1; depth <= listMaxDepth; depth++ {
		l := listOf(t, run(t, tb, "list", map[string]any{"depth": depth}))
		if len(l.Entries) != depth || l.Unexpanded != 1 {
			t.Errorf("depth %d: %d entries, %d unexpanded: %v", depth, len(l.Entries), l.Unexpanded, entryPaths(l))
		}
		if got := l.Entries[len(l.Entries)-1].Path; got != strings.Join(strings.Split(deep, "/")[:depth], "/") {
			t.Errorf("depth %d: deepest entry %s", depth, got)
		}
	}
	for _, bad := range []int{-1, listMaxDepth + 1} {
		r := run(t, tb, "list", map[string]any{"depth": bad})
		if !r.IsError || !strings.Contains(tbText(t, r), fmt.Sprintf("depth %d is out of range; give 1 to 10", bad)) {
			t.Errorf("depth %d: %+v", bad, r)
		}
	}
	tbBadArgs(t, run(t, tb, "list", map[string]any{"depth": "2"}), `field "depth" must be an integer`)
	tbBadArgs(t, run(t, tb, "list", map[string]any{"recursive": true}), "unknown field")
}

// A listing stops at listMaxEntries, breadth first: the top level is
// whole even when a subdirectory alone has more entries than the cap.
func TestListCap(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	for i := range 1500 {
		tbFile(t, dir, fmt.Sprintf("a/f%04d", i), "")
	}
	for _, name := range []string{"z1", "z2", "z3"} {
		tbFile(t, dir, name, "")
	}
	r := run(t, tb, "list", map[string]any{})
	l := listOf(t, r)
	if len(l.Entries) != listMaxEntries || !l.Truncated || l.Unlisted != 1500-(listMaxEntries-4) {
		t.Fatalf("%d entries, truncated %v, unlisted %d", len(l.Entries), l.Truncated, l.Unlisted)
	}
	paths := entryPaths(l)
	for _, p := range []string{"a", "z1", "z2", "z3", "a/f0000", "a/f0995"} {
		if !slices.Contains(paths, p) {
			t.Errorf("listing lacks %s", p)
		}
	}
	if slices.Contains(paths, "a/f0996") {
		t.Errorf("listing has more than %d entries", listMaxEntries)
	}
	if text := tbText(t, r); !strings.HasSuffix(text, "[Stopped at 1000 entries; at least 504 more not shown. List a subdirectory, or give a smaller depth.]") {
		t.Errorf("note: %q", text[len(text)-200:])
	}
	if !slices.IsSortedFunc(l.Entries, func(x, y listEntry) int { return comparePaths(x.Path, y.Path) }) {
		t.Error("entries are not in tree order")
	}
}

// Links are listed, never followed: loops end, and a link out of the tree
// does not show what it leads to.
func TestListSymlinkLoop(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	outside := t.TempDir()
	tbFile(t, outside, "secret.txt", "x")
	tbLink(t, dir, "self", ".")
	tbLink(t, dir, "up", "..")
	tbLink(t, dir, "loop", "loop")
	tbLink(t, dir, "sub/back", "..")
	tbLink(t, dir, "out", outside)
	l := listOf(t, run(t, tb, "list", map[string]any{"depth": listMaxDepth}))
	want := []string{"loop", "out", "self", "sub", "sub/back", "up"}
	if got := entryPaths(l); !slices.Equal(got, want) {
		t.Errorf("entries %v, want %v", got, want)
	}
	// Listing through a link lists where it leads (the path is resolved
	// and checked like read's), still without following links below.
	l = listOf(t, run(t, tb, "list", map[string]any{"path": "out"}))
	if got := entryPaths(l); !slices.Equal(got, []string{"secret.txt"}) {
		t.Errorf("list through a link: %v", got)
	}
	r := run(t, tb, "list", map[string]any{"path": "loop"})
	if !r.IsError || !strings.Contains(tbText(t, r), "too many levels of symbolic links") {
		t.Errorf("list a looping link: %+v", r)
	}
}

func TestListFailures(t *testing.T) {
	tb := tbNew(t)
	file := tbFile(t, tb.cfg.Cwd, "f.txt", "hello")
	for _, tt := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"path": "f.txt"}, file + " is a file (5 bytes), not a directory; use read for a file"},
		{map[string]any{"path": "missing"}, filepath.Join(tb.cfg.Cwd, "missing") + ": no such file"},
		{map[string]any{"path": "f.txt/x"}, "a parent of it is not a directory"},
	} {
		r := run(t, tb, "list", tt.args)
		if !r.IsError || !strings.Contains(tbText(t, r), tt.want) {
			t.Errorf("list %v: %+v, want %q", tt.args, r, tt.want)
		}
	}
	// A directory that cannot be read when its turn comes (here: gone,
	// or swapped for a link) is marked on its entry.
	root, err := safefs.OpenDir(tb.cfg.Cwd, false)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	tbLink(t, tb.cfg.Cwd, "swapped", t.TempDir())
	l := &lister{t: tb, path: tb.cfg.Cwd, target: tb.cfg.Cwd, out: listing{Depth: 2, Entries: []listEntry{{Path: "gone", Type: "dir"}, {Path: "swapped", Type: "dir"}}}}
	for _, rel := range []string{"gone", "swapped"} {
		if subs, full, err := l.readDir(root, rel, 2); subs != nil || full || err != nil {
			t.Errorf("readDir(%s) = %v, %v, %v", rel, subs, full, err)
		}
	}
	if e := l.out.Entries; e[0].Error != "no such file" || !strings.Contains(e[1].Error, "changed while it was being checked") {
		t.Errorf("entries = %+v", e)
	}
	if text := l.out.text(); !strings.Contains(text, "gone/  [unreadable: no such file]") {
		t.Errorf("text: %q", text)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r, _ := tbCall(t, ctx, tb, "list", map[string]any{})
	if r.Error == nil || r.Error.Code != protocol.CodeCancelled {
		t.Errorf("cancelled list: %+v", r)
	}
}

// Entries the host policy does not let the tools read are left out and
// counted, and so are the agent's own files.
func TestListPolicyHidden(t *testing.T) {
	g := tbPolicy(t, `paths: {deny: ["**/secret/**", "*.pem"], read: {deny: ["CWD/private"]}}`)
	g.file(t, "ok.txt", "x")
	g.file(t, "key.pem", "x")
	g.file(t, "secret/a.txt", "x")
	g.file(t, "private/b.txt", "x")
	g.file(t, "src/c.txt", "x")
	g.file(t, "src/d.pem", "x")
	r := run(t, g.toolbox, "list", map[string]any{})
	l := listOf(t, r)
	if got := entryPaths(l); !slices.Equal(got, []string{"ok.txt", "src", "src/c.txt"}) {
		t.Errorf("entries %v", got)
	}
	if l.Hidden != 4 || !strings.Contains(tbText(t, r), "[4 entries hidden: the host policy does not let the tools read them, or they are the agent's own.]") {
		t.Errorf("hidden %d; text %q", l.Hidden, tbText(t, r))
	}
	wantDenied(t, "list a denied directory", run(t, g.toolbox, "list", map[string]any{"path": "secret"}), `paths.deny "**/secret/**"`)

	// The directory that holds the agent's files: the policy file is
	// readable, the credentials and the state directory are not.
	if err := os.MkdirAll(filepath.Join(g.state, "output"), 0o700); err != nil {
		t.Fatal(err)
	}
	tbFile(t, g.state, "tasks.json", "{}")
	own := filepath.Dir(g.state)
	l = listOf(t, run(t, g.toolbox, "list", map[string]any{"path": own}))
	if got := entryPaths(l); !slices.Equal(got, []string{"policy.yaml"}) || l.Hidden != 2 {
		t.Errorf("own directory: entries %v, hidden %d", got, l.Hidden)
	}
	wantDenied(t, "list the state directory", run(t, g.toolbox, "list", map[string]any{"path": g.state}), "its state directory")
}
