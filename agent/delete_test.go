//go:build unix

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// tbExists reports whether p exists, without following a link.
func tbExists(t *testing.T, p string) bool {
	t.Helper()
	_, err := os.Lstat(p)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return err == nil
}

// wantFailure checks that r is a tool failure whose text mentions want.
func wantFailure(t *testing.T, what string, r *protocol.Result, want string) {
	t.Helper()
	if r.Error != nil || !r.IsError {
		t.Errorf("%s: %+v, want a tool failure", what, r)
		return
	}
	if text := r.Content[0].Text; !strings.Contains(text, want) {
		t.Errorf("%s: %q does not mention %q", what, text, want)
	}
}

func TestDelete(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	file := tbFile(t, dir, "a.txt", "hello")
	outside := tbFile(t, t.TempDir(), "target.txt", "keep")
	link := tbLink(t, dir, "link", outside)
	dirLink := tbLink(t, dir, "dirlink", filepath.Dir(outside))
	tree := tbFile(t, dir, "tree/sub/deep/x.txt", "x")
	tbFile(t, dir, "tree/y.txt", "y")
	tbLink(t, dir, "tree/sub/out", filepath.Dir(outside))

	tbWant(t, run(t, tb, "delete", map[string]any{"path": "a.txt"}), false, "Deleted file "+file)
	if tbExists(t, file) {
		t.Error("the file is still there")
	}
	// A link is deleted, never what it leads to.
	tbWant(t, run(t, tb, "delete", map[string]any{"path": "link"}), false, "Deleted symbolic link "+link)
	tbWant(t, run(t, tb, "delete", map[string]any{"path": "dirlink", "recursive": true}), false, "Deleted symbolic link "+dirLink)
	if tbExists(t, link) || tbExists(t, dirLink) || tbRead(t, outside) != "keep" {
		t.Error("deleting links: wrong thing deleted")
	}

	// A directory only with recursive; its links are deleted, not
	// followed.
	treeDir := filepath.Join(dir, "tree")
	wantFailure(t, "delete a directory", run(t, tb, "delete", map[string]any{"path": "tree"}), "is a directory; set recursive: true")
	wantFailure(t, "delete a directory with a hash", run(t, tb, "delete", map[string]any{"path": "tree", "recursive": true, "expected_sha256": sha256Hex(nil)}),
		"expected_sha256 applies to files only")
	if !tbExists(t, tree) {
		t.Fatal("a refused delete deleted")
	}
	r := run(t, tb, "delete", map[string]any{"path": "tree", "recursive": true})
	tbWant(t, r, false, "Deleted directory "+treeDir+" and the 5 entries in it")
	if tbExists(t, treeDir) || tbRead(t, outside) != "keep" {
		t.Error("recursive delete: wrong result")
	}

	for _, tt := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"path": ""}, "path is empty"},
		{map[string]any{"path": "missing"}, "missing: no such file"},
		{map[string]any{"path": "/"}, "/ is the root directory"},
		{map[string]any{"path": "x", "expected_sha256": "abc"}, "is not a SHA-256 hash"},
	} {
		wantFailure(t, "delete "+tt.args["path"].(string), run(t, tb, "delete", tt.args), tt.want)
	}
	fifo := filepath.Join(dir, "pipe")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	wantFailure(t, "delete a pipe", run(t, tb, "delete", map[string]any{"path": "pipe"}), "is a named pipe; delete removes only files")
	tbBadArgs(t, run(t, tb, "delete", map[string]any{"path": "x", "force": true}), "unknown field")
}

// A stale expected_sha256 leaves the file untouched; the right one
// deletes it.
func TestDeleteExpectedHash(t *testing.T) {
	tb := tbNew(t)
	file := tbFile(t, tb.cfg.Cwd, "a.txt", "current")
	r := run(t, tb, "delete", map[string]any{"path": "a.txt", "expected_sha256": sha256Hex([]byte("old"))})
	wantFailure(t, "stale hash", r, "has changed: its sha256 is "+sha256Hex([]byte("current")))
	if tbRead(t, file) != "current" {
		t.Fatal("a refused delete changed the file")
	}
	link := tbLink(t, tb.cfg.Cwd, "link", file)
	wantFailure(t, "hash on a link", run(t, tb, "delete", map[string]any{"path": "link", "expected_sha256": sha256Hex([]byte("current"))}),
		"is a symbolic link; expected_sha256 applies to regular files only")
	if !tbExists(t, link) {
		t.Fatal("a refused delete deleted the link")
	}
	tbWant(t, run(t, tb, "delete", map[string]any{"path": "a.txt", "expected_sha256": "sha256:" + strings.ToUpper(sha256Hex([]byte("current")))}), false, "Deleted file "+file)
}

// A recursive delete checks every entry first: one refused entry, or the
// agent's own files or working directory anywhere in the tree, and
// nothing is deleted.
func TestDeleteRecursiveRefused(t *testing.T) {
	g := tbPolicy(t, `paths: {write: {deny: ["**/keep.txt"]}, deny: ["CWD/tree/hidden"]}`)
	files := []string{
		g.file(t, "tree/a.txt", "a"),
		g.file(t, "tree/sub/b.txt", "b"),
		g.file(t, "tree/sub/z/keep.txt", "keep"),
		g.file(t, "tree/zz.txt", "z"),
	}
	wantDenied(t, "delete a tree with a refused entry", run(t, g.toolbox, "delete", map[string]any{"path": "tree", "recursive": true}), `paths.write.deny "**/keep.txt"; nothing was deleted`)
	for _, f := range files {
		if !tbExists(t, f) {
			t.Errorf("%s was deleted", f)
		}
	}
	// An entry denied altogether (also for reading) refuses too.
	if err := os.Remove(files[2]); err != nil {
		t.Fatal(err)
	}
	g.file(t, "tree/hidden", "h")
	wantDenied(t, "delete a tree with a hidden entry", run(t, g.toolbox, "delete", map[string]any{"path": "tree", "recursive": true}), `paths.deny "`+g.cwd+`/tree/hidden"`)
	if !tbExists(t, files[0]) {
		t.Error("a refused delete deleted")
	}

	// The agent's own files: the directory that holds its state
	// directory, policy file and credentials.
	own := filepath.Dir(g.state)
	wantDenied(t, "delete the parent of the state directory", run(t, g.toolbox, "delete", map[string]any{"path": own, "recursive": true}), "belongs to the agent")
	wantDenied(t, "delete the policy file", run(t, g.toolbox, "delete", map[string]any{"path": g.policyFile}), "its policy file")
	wantDenied(t, "delete the state directory", run(t, g.toolbox, "delete", map[string]any{"path": g.state, "recursive": true}), "its state directory")
	if !tbExists(t, g.policyFile) || !tbExists(t, g.state) {
		t.Fatal("the agent's own files were deleted")
	}
	// A link to the state directory is just a link.
	g.link(t, g.state, "state-link")
	wantAllowed(t, "delete a link to the state directory", run(t, g.toolbox, "delete", map[string]any{"path": "state-link"}))
	if !tbExists(t, g.state) {
		t.Fatal("deleting a link deleted the state directory")
	}
	// The working directory and what holds it.
	wantFailure(t, "delete the working directory", run(t, g.toolbox, "delete", map[string]any{"path": g.cwd, "recursive": true}),
		"is the agent's working directory or holds it")
	nested := filepath.Join(t.TempDir(), "a", "cwd")
	if err := os.MkdirAll(nested, 0o755); err != nil {
		t.Fatal(err)
	}
	state, err := os.MkdirTemp("", "state")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	tb, err := newToolbox(toolboxConfig{Cwd: nested, StateDir: state, Shell: "/bin/sh", BashDefaultTimeout: time.Second, BashMaxTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	wantFailure(t, "delete what holds the working directory", run(t, tb, "delete", map[string]any{"path": "../..", "recursive": true}),
		"is the agent's working directory or holds it")
	if !tbExists(t, nested) {
		t.Fatal("the working directory was deleted")
	}
	if !tbExists(t, files[0]) {
		t.Fatal("the working directory was deleted")
	}
}

// An entry refused during the deletion itself (it appeared after the
// check) stops it, and the result says what was deleted.
func TestDeleteStopsOnNewRefusal(t *testing.T) {
	dir := t.TempDir()
	tbFile(t, dir, "tree/a/1.txt", "1")
	tbFile(t, dir, "tree/b/late.txt", "late")
	tbFile(t, dir, "tree/c/2.txt", "2")
	top, err := safefs.OpenDir(filepath.Join(dir, "tree"), false)
	if err != nil {
		t.Fatal(err)
	}
	defer top.Close()
	meta, err := top.Lstat(".")
	if err != nil {
		t.Fatal(err)
	}
	w := &treeWalk{ctx: context.Background(), top: filepath.Join(dir, "tree"), dev: meta.Dev, check: func(rel string, _ *safefs.Meta) error {
		if rel == "b/late.txt" {
			return &policy.Denial{Rule: "paths.deny", Reason: "write " + rel + ": refused"}
		}
		return nil
	}}
	removed := 0
	err = w.removeAll(top, "", 0, &removed)
	if !isDenied(err) {
		t.Fatalf("removeAll = %v, want the refusal", err)
	}
	if !tbExists(t, filepath.Join(dir, "tree/b/late.txt")) {
		t.Error("the refused entry was deleted")
	}
	r := treeFailure(&toolCall{ID: "c1"}, w.top, err, fmt.Sprintf("%d entries were deleted before it stopped", removed))
	if r.Error == nil || r.Error.Code != protocol.CodeDenied || !strings.HasSuffix(r.Error.Message, "refused; "+fmt.Sprint(removed)+" entries were deleted before it stopped") {
		t.Errorf("result %+v", r)
	}
	// The walk's bounds are checked, not assumed.
	w = &treeWalk{ctx: context.Background(), top: w.top, dev: meta.Dev + 1, check: func(string, *safefs.Meta) error { return nil }}
	var lim *treeLimit
	if err := w.visit(top, "", 0); !errors.As(err, &lim) || !strings.Contains(lim.msg, "is a mount point") {
		t.Errorf("a subdirectory on another device: %v", err)
	}
}
