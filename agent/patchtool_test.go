//go:build unix

package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/unidiff"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// treeState maps every file and directory under root to its content
// (directories: "<dir>"), mode and modification time.
func treeState(t testing.TB, root string) map[string]string {
	t.Helper()
	state := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			state[rel] = "<dir>"
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil && d.Type()&fs.ModeSymlink == 0 {
			return err
		}
		state[rel] = fmt.Sprintf("%s|%v|%d", data, fi.Mode(), fi.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return state
}

// sameTree checks that root is as before.
func sameTree(t *testing.T, root string, before map[string]string) {
	t.Helper()
	after := treeState(t, root)
	for p, v := range before {
		if after[p] != v {
			t.Errorf("%s changed:\n%q\nbecame\n%q", p, abbrev(v), abbrev(after[p]))
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			t.Errorf("%s appeared", p)
		}
	}
}

// patchResult decodes a patch result's structured content.
type patchResultJSON struct {
	DryRun  bool        `json:"dry_run"`
	Applied bool        `json:"applied"`
	Files   []patchFile `json:"files"`
}

func structured(t *testing.T, r *protocol.Result) patchResultJSON {
	t.Helper()
	var out patchResultJSON
	if err := json.Unmarshal(r.Structured, &out); err != nil {
		t.Fatalf("structured content %s: %v", r.Structured, err)
	}
	return out
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func patchCall(t *testing.T, tb *toolbox, patch string, dryRun bool) *protocol.Result {
	t.Helper()
	r, _ := tbCall(t, context.Background(), tb, "patch", map[string]any{"host": "h", "patch": patch, "dry_run": dryRun})
	return r
}

func TestPatchMultiFile(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	a := tbFile(t, dir, "src/a.go", "package a\n\nfunc A() int {\n\treturn 1\n}\n")
	b := tbFile(t, dir, "src/b.go", "package b\n\nvar x = 1\n")
	gone := tbFile(t, dir, "old.txt", "bye\n")
	if err := os.Chmod(a, 0o755); err != nil {
		t.Fatal(err)
	}
	patch := `diff --git a/src/a.go b/src/a.go
index 1..2 100644
--- a/src/a.go
+++ b/src/a.go
@@ -3,3 +3,3 @@ package a
 func A() int {
-	return 1
+	return 2
 }
diff --git a/src/b.go b/src/b.go
--- a/src/b.go
+++ b/src/b.go
@@ -1,3 +1,4 @@
 package b
 
 var x = 1
+var y = 2
diff --git a/docs/new/readme.md b/docs/new/readme.md
new file mode 100644
--- /dev/null
+++ b/docs/new/readme.md
@@ -0,0 +1,2 @@
+# New
+text
diff --git a/old.txt b/old.txt
deleted file mode 100644
--- a/old.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
`
	r := patchCall(t, tb, patch, false)
	newFile := filepath.Join(dir, "docs/new/readme.md")
	tbWant(t, r, false, "Patched 4 files (+4 -2).\n"+
		"created "+newFile+": 1 hunk, +2 -0\n"+
		"deleted "+gone+": 1 hunk, +0 -1\n"+
		"modified "+a+": 1 hunk, +1 -1\n"+
		"modified "+b+": 1 hunk, +1 -0")
	wantA := "package a\n\nfunc A() int {\n\treturn 2\n}\n"
	for p, want := range map[string]string{a: wantA, b: "package b\n\nvar x = 1\nvar y = 2\n", newFile: "# New\ntext\n"} {
		if got := tbRead(t, p); got != want {
			t.Errorf("%s = %q, want %q", p, got, want)
		}
	}
	if _, err := os.Lstat(gone); !os.IsNotExist(err) {
		t.Errorf("old.txt still there: %v", err)
	}
	if m := tbMode(t, a); m != 0o755 {
		t.Errorf("a.go mode = %v, want 0755 kept", m)
	}
	if m := tbMode(t, newFile); m != 0o644 {
		t.Errorf("new file mode = %v, want 0644", m)
	}
	s := structured(t, r)
	if !s.Applied || s.DryRun || len(s.Files) != 4 {
		t.Fatalf("structured = %+v", s)
	}
	f := s.Files[2]
	if f.Path != a || f.Action != "modified" || f.SHA256 != sha(wantA) || f.Added != 1 || f.Removed != 1 || len(f.Hunks) != 1 || !f.Hunks[0].OK || f.Hunks[0].Line != 3 {
		t.Errorf("a.go entry = %+v", f)
	}
	if d := s.Files[1]; d.Action != "deleted" || d.SHA256 != "" {
		t.Errorf("deleted entry = %+v", d)
	}
	tbOnly(t, dir, "docs", "src")
	tbOnly(t, filepath.Join(dir, "src"), "a.go", "b.go")
}

// TestPatchOneBadHunkChangesNothing: a single failing hunk leaves every
// file byte-identical (not even rewritten), and the error names each
// failing hunk with its reason.
func TestPatchOneBadHunkChangesNothing(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	tbFile(t, dir, "a.txt", "1\n2\n3\n")
	c := tbFile(t, dir, "c.txt", "x\ny\nz\n")
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	for _, p := range []string{filepath.Join(dir, "a.txt"), c} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	before := treeState(t, dir)
	patch := "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n 1\n-2\n+two\n 3\n" +
		"--- /dev/null\n+++ b/sub/new.txt\n@@ -0,0 +1 @@\n+new\n" +
		"--- a/c.txt\n+++ b/c.txt\n@@ -1,2 +1,2 @@\n-x\n+X\n y\n@@ -3 +3 @@\n-Z\n+zz\n"
	r := patchCall(t, tb, patch, false)
	tbWant(t, r, true, "The patch was not applied; nothing was changed. 1 of 4 hunks failed.\n"+
		c+`: hunk 2 @@ -3,1 +3,1 @@: not found: placed at line 3, its removed line 1 (file line 3) differs: file has "z", patch expects "Z"; the hunk matches nowhere else in the file`)
	sameTree(t, dir, before)
	s := structured(t, r)
	if s.Applied || len(s.Files) != 3 || s.Files[1].Action != "failed" || s.Files[1].Hunks[0].OK != true || s.Files[1].Hunks[1].OK {
		t.Errorf("structured = %+v", s)
	}
}

func TestPatchDryRun(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	p := tbFile(t, dir, "f.txt", "head\n1\n2\n3\n4\n5\n")
	before := treeState(t, dir)
	patch := "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n-1\n+one\n 2\n@@ -4,2 +4,2 @@\n 4\n-5\n+five\n" +
		"--- /dev/null\n+++ b/g.txt\n@@ -0,0 +1 @@\n+g\n"
	r := patchCall(t, tb, patch, true)
	tbWant(t, r, false, "Dry run: the patch applies cleanly to 2 files (+3 -2); nothing was written.\n"+
		"modified "+p+": 2 hunks, +2 -2\n"+
		"  hunk 1 @@ -1,2 +1,2 @@: applies at line 2 (offset +1 line)\n"+
		"  hunk 2 @@ -4,2 +4,2 @@: applies at line 5 (offset +1 line)\n"+
		"created "+filepath.Join(dir, "g.txt")+": 1 hunk, +1 -0\n"+
		"  hunk 1 @@ -0,0 +1,1 @@: applies at the start of the file")
	sameTree(t, dir, before)
	s := structured(t, r)
	if !s.DryRun || s.Applied || s.Files[0].SHA256 != sha("head\none\n2\n3\n4\nfive\n") {
		t.Errorf("structured = %+v", s)
	}

	// A dry run of a patch that fails says why, per hunk.
	r = patchCall(t, tb, "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n-1\n+one\n 2\n@@ -4,2 +4,2 @@\n 4\n-6\n+six\n", true)
	tbWant(t, r, true, "Dry run: the patch does not apply; nothing was written. 1 of 2 hunks failed.\n"+
		p+": hunk 1 @@ -1,2 +1,2 @@: applies at line 2 (offset +1 line)\n"+
		p+`: hunk 2 @@ -4,2 +4,2 @@: not found: placed at line 5, its removed line 2 (file line 6) differs: file has "5", patch expects "6"; the hunk matches nowhere else in the file`)
	sameTree(t, dir, before)
}

func TestPatchCreateAndDelete(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	exists := tbFile(t, dir, "exists.txt", "here\n")
	victim := tbFile(t, dir, "victim.txt", "a\nb\n")
	before := treeState(t, dir)
	for _, tt := range []struct{ name, patch, want string }{
		{"create over an existing file", "--- /dev/null\n+++ b/exists.txt\n@@ -0,0 +1 @@\n+x\n",
			exists + " already exists, but the patch creates it (--- /dev/null, patch line 1); to change it, name it on the --- line too, or delete it first"},
		{"delete with other content", "--- a/victim.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-c\n",
			`its removed line 2 (file line 2) differs: file has "b", patch expects "c"`},
		{"delete only part", "--- a/victim.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n",
			victim + ": the patch deletes it (+++ /dev/null) but leaves 1 of its lines unremoved"},
		{"delete without the missing newline", "--- a/victim.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n\\ No newline at end of file\n",
			"ends in a newline; the patch expects none"},
		{"modify a missing file", "--- a/nope.txt\n+++ b/nope.txt\n@@ -1 +1 @@\n-a\n+b\n",
			filepath.Join(dir, "nope.txt") + ": no such file (patch line 1); a patch that creates a file has --- /dev/null"},
		{"delete a missing file", "--- a/nope.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n", "no such file"},
		{"git delete of a non-empty file", "diff --git a/victim.txt b/victim.txt\ndeleted file mode 100644\nindex 1..0\n", "leaves 2 of its lines unremoved"},
		{"create in place of a directory's file", "--- /dev/null\n+++ b/exists.txt/x\n@@ -0,0 +1 @@\n+x\n", "a parent of it is not a directory"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := patchCall(t, tb, tt.patch, false)
			if !r.IsError || !strings.Contains(tbText(t, r), tt.want) {
				t.Errorf("result %+v\nwant a failure with %q", tbText(t, r), tt.want)
			}
			sameTree(t, dir, before)
		})
	}

	// Git's form for an empty file: no hunks.
	r := patchCall(t, tb, "diff --git a/empty b/empty\nnew file mode 100755\nindex 0000000..e69de29\n", false)
	if r.IsError {
		t.Fatal(tbText(t, r))
	}
	empty := filepath.Join(dir, "empty")
	if got := tbRead(t, empty); got != "" || tbMode(t, empty) != 0o755 {
		t.Errorf("empty file: %q mode %v", got, tbMode(t, empty))
	}
	r = patchCall(t, tb, "diff --git a/empty b/empty\ndeleted file mode 100755\nindex e69de29..0000000\n", false)
	if r.IsError {
		t.Fatal(tbText(t, r))
	}
	r = patchCall(t, tb, "--- a/victim.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-a\n-b\n", false)
	tbWant(t, r, false, "Patched 1 file (+0 -2).\ndeleted "+victim+": 1 hunk, +0 -2")
	tbOnly(t, dir, "exists.txt")
}

// TestPatchConcurrent: patches naming the same files in different
// orders neither deadlock nor lose changes.
func TestPatchConcurrent(t *testing.T) {
	tb := tbNew(t)
	a := tbFile(t, tb.cfg.Cwd, "a.txt", "")
	b := tbFile(t, tb.cfg.Cwd, "b.txt", "")
	const n = 20
	done := make(chan *protocol.Result)
	for i := range n {
		go func() {
			pa := fmt.Sprintf("--- a/a.txt\n+++ b/a.txt\n@@ -0,0 +1 @@\n+%d\n", i)
			pb := fmt.Sprintf("--- a/b.txt\n+++ b/b.txt\n@@ -0,0 +1 @@\n+%d\n", i)
			if i%2 == 1 {
				pa, pb = pb, pa
			}
			tc := &toolCall{ID: "c", Args: mustJSON(t, map[string]any{"patch": pa + pb}), Output: func([]byte) {}}
			done <- tb.patch(context.Background(), tc)
		}()
	}
	for range n {
		select {
		case r := <-done:
			if r.IsError {
				t.Errorf("patch failed: %+v", r.Content)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("patches deadlocked")
		}
	}
	for _, p := range []string{a, b} {
		if lines := strings.Count(tbRead(t, p), "\n"); lines != n {
			t.Errorf("%s has %d lines, want %d", p, lines, n)
		}
	}
	if l := tb.locks.Held(); l != 0 {
		t.Errorf("%d locks left", l)
	}
}

func TestPatchReportCapped(t *testing.T) {
	var b strings.Builder
	for i := range 2*maxPatchReportLines + 10 {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	got := capLines(b.String())
	if n := strings.Count(got, "\n"); n != maxPatchReportLines {
		t.Errorf("%d lines kept, want %d", n, maxPatchReportLines)
	}
	if !strings.HasSuffix(got, "line 499\n[510 more lines; the structured result lists every file and hunk]") {
		t.Errorf("ends %q", got[len(got)-80:])
	}
	if got := capLines("a\nb\n"); got != "a\nb" {
		t.Errorf("short report = %q", got)
	}
}

func TestPatchOffsetReported(t *testing.T) {
	tb := tbNew(t)
	p := tbFile(t, tb.cfg.Cwd, "f.txt", "new 1\nnew 2\nnew 3\na\nb\nc\n")
	r := patchCall(t, tb, "--- f.txt\n+++ f.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n", false)
	tbWant(t, r, false, "Patched 1 file (+1 -1).\nmodified "+p+": 1 hunk, +1 -1\n  hunk 1 @@ -1,3 +1,3 @@: applied at line 4 (offset +3 lines)")
	r = patchCall(t, tb, "--- f.txt\n+++ f.txt\n@@ -2,0 +3 @@\n+ins\n", true)
	tbWant(t, r, false, "Dry run: the patch applies cleanly to 1 file (+1 -0); nothing was written.\nmodified "+p+": 1 hunk, +1 -0\n  hunk 1 @@ -2,0 +3,1 @@: applies after line 2")
	if got := tbRead(t, p); got != "new 1\nnew 2\nnew 3\na\nB\nc\n" {
		t.Errorf("content = %q", got)
	}
}

func TestPatchLineEndings(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	crlf := tbFile(t, dir, "win.txt", "\xef\xbb\xbfline 1\r\nline 2\r\nline 3\r\n")
	noEOL := tbFile(t, dir, "noeol.txt", "a\nb")
	withEOL := tbFile(t, dir, "eol.txt", "a\nb\n")
	patch := "--- a/win.txt\n+++ b/win.txt\n@@ -1,3 +1,4 @@\n line 1\n-line 2\n+line two\n+line 2.5\n line 3\n" +
		"--- a/noeol.txt\n+++ b/noeol.txt\n@@ -1,2 +1,3 @@\n a\n-b\n\\ No newline at end of file\n+b\n+c\n" +
		"--- a/eol.txt\n+++ b/eol.txt\n@@ -1,2 +1,2 @@\n a\n-b\n+b\n\\ No newline at end of file\n"
	if r := patchCall(t, tb, patch, false); r.IsError {
		t.Fatal(tbText(t, r))
	}
	for p, want := range map[string]string{
		crlf:    "\xef\xbb\xbfline 1\r\nline two\r\nline 2.5\r\nline 3\r\n",
		noEOL:   "a\nb\nc\n",
		withEOL: "a\nb",
	} {
		if got := tbRead(t, p); got != want {
			t.Errorf("%s = %q, want %q", filepath.Base(p), got, want)
		}
	}
}

// TestPatchPolicyDenied: one file the host policy refuses refuses the
// whole patch.
func TestPatchPolicyDenied(t *testing.T) {
	g := tbPolicy(t, `paths: {allow: ["CWD/**"], write: {deny: ["CWD/locked/**"]}}`)
	ok := g.file(t, "ok.txt", "a\n")
	g.file(t, "locked/f.txt", "a\n")
	before := treeState(t, g.cwd)
	patch := "--- a/ok.txt\n+++ b/ok.txt\n@@ -1 +1 @@\n-a\n+b\n--- a/locked/f.txt\n+++ b/locked/f.txt\n@@ -1 +1 @@\n-a\n+b\n"
	r := run(t, g.toolbox, "patch", map[string]any{"patch": patch})
	wantDenied(t, "patch with a locked file", r, "locked/f.txt")
	wantDenied(t, "patch with a locked file", r, "nothing was changed")
	for _, p := range []string{"--- /dev/null\n+++ b/locked/new.txt\n@@ -0,0 +1 @@\n+x\n", "--- /dev/null\n+++ " + g.secret + "\n@@ -0,0 +1 @@\n+x\n",
		"--- a/" + g.policyFile + "\n+++ b/" + g.policyFile + "\n@@ -1 +1 @@\n-a\n+b\n"} {
		wantDenied(t, "patch "+p, run(t, g.toolbox, "patch", map[string]any{"patch": patch[:strings.Index(patch, "--- a/locked")] + p}), "denied")
	}
	sameTree(t, g.cwd, before)
	if got := tbRead(t, ok); got != "a\n" {
		t.Errorf("ok.txt = %q", got)
	}
	wantAllowed(t, "patch ok.txt alone", run(t, g.toolbox, "patch", map[string]any{"patch": patch[:strings.Index(patch, "--- a/locked")]}))
}

func TestPatchArguments(t *testing.T) {
	tb := tbNew(t)
	r, _ := tbCall(t, context.Background(), tb, "patch", json.RawMessage(`{"patch":"x","dryrun":true}`))
	tbBadArgs(t, r, `unknown field "dryrun"; the arguments are patch, dry_run`)
	tbWant(t, patchCall(t, tb, "  \n", false), true, "patch is empty; give a unified diff (the output of git diff or diff -u)")
	tbWant(t, patchCall(t, tb, "--- a/f\n+++ b/g\n@@ -1 +1 @@\n-a\n+b\n", false), true,
		"patch line 1: --- names f but +++ names g; a patch changes each file in place. Renames are not supported: move the file first (move tool or bash mv), then patch it under one name; nothing was changed")
	bin := tbFile(t, tb.cfg.Cwd, "b.bin", "\x00\x01")
	r = patchCall(t, tb, "--- a/b.bin\n+++ b/b.bin\n@@ -1 +1 @@\n-a\n+b\n", false)
	tbWant(t, r, true, "The patch was not applied; nothing was changed.\n"+bin+" is a binary file (2 bytes); patch works on text files only; use write for other files")
}

// TestPatchSameFileTwice: sections for one file apply in order, also
// when a link names it a second time.
func TestPatchSameFileTwice(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	p := tbFile(t, dir, "f.txt", "1\n2\n3\n")
	if err := os.Symlink("f.txt", filepath.Join(dir, "link.txt")); err != nil {
		t.Fatal(err)
	}
	patch := "--- a/f.txt\n+++ b/f.txt\n@@ -1 +1 @@\n-1\n+one\n--- a/link.txt\n+++ b/link.txt\n@@ -1,2 +1,2 @@\n-one\n+uno\n 2\n"
	r := patchCall(t, tb, patch, false)
	tbWant(t, r, false, "Patched 1 file (+2 -2).\nmodified "+p+": 2 hunks, +2 -2")
	if got := tbRead(t, p); got != "uno\n2\n3\n" {
		t.Errorf("content = %q", got)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "link.txt")); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("link replaced: %v", err)
	}
	// Created, then changed by a later section.
	r = patchCall(t, tb, "--- /dev/null\n+++ b/n.txt\n@@ -0,0 +1 @@\n+a\n--- a/n.txt\n+++ b/n.txt\n@@ -1 +1,2 @@\n a\n+b\n", false)
	if r.IsError || tbRead(t, filepath.Join(dir, "n.txt")) != "a\nb\n" {
		t.Errorf("create then change: %s", tbText(t, r))
	}
}

// TestPatchRollback: when a step of the commit fails, the files already
// changed are put back as they were.
func TestPatchRollback(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	tbFile(t, dir, "a.txt", "a\n")
	tbFile(t, dir, "c.txt", "c\n")
	tbFile(t, dir, "d.txt", "d\n")
	before := treeState(t, dir)
	patch := "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-a\n+A\n" +
		"--- /dev/null\n+++ b/new/b.txt\n@@ -0,0 +1 @@\n+b\n" +
		"--- a/c.txt\n+++ b/c.txt\n@@ -1 +1 @@\n-c\n+C\n" +
		"--- a/d.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-d\n"

	// Another process creates new/b.txt just before the patch does.
	intruder := filepath.Join(dir, "new/b.txt")
	tc := &toolCall{ID: "c", Args: mustJSON(t, map[string]any{"patch": patch}), Output: func([]byte) {}}
	r := tb.runPatch(context.Background(), tc, &patchHooks{before: func(step int, path string) {
		if path == intruder {
			tbFile(t, dir, "new/b.txt", "theirs\n")
		}
	}})
	tbWant(t, r, true, "the patch was not applied: create "+intruder+": "+intruder+" appeared while the patch was being applied; every file was put back as it was, nothing was changed")
	if got := tbRead(t, intruder); got != "theirs\n" {
		t.Errorf("the other process's file = %q", got)
	}
	if err := os.RemoveAll(filepath.Join(dir, "new")); err != nil {
		t.Fatal(err)
	}
	sameTree(t, dir, before)

	// A deletion, the last step, fails: every write is undone.
	r = tb.runPatch(context.Background(), tc, &patchHooks{before: func(step int, path string) {
		if filepath.Base(path) == "d.txt" {
			replaceWithDir(t, path)
		}
	}})
	if !r.IsError || !strings.Contains(tbText(t, r), "every file was put back as it was") {
		t.Errorf("failed deletion: %s", tbText(t, r))
	}
	if err := os.RemoveAll(filepath.Join(dir, "d.txt")); err != nil {
		t.Fatal(err)
	}
	tbFile(t, dir, "d.txt", "d\n")
	delete(before, "d.txt")
	after := treeState(t, dir)
	delete(after, "d.txt")
	for p, v := range before {
		if after[p] != v {
			t.Errorf("%s changed: %q", p, abbrev(after[p]))
		}
	}
	if len(after) != len(before) {
		t.Errorf("tree %v, want %v", slices.Sorted(mapKeys(after)), slices.Sorted(mapKeys(before)))
	}
}

// TestPatchRollbackFails: when putting a file back fails too, the
// result says so and which file is affected.
func TestPatchRollbackFails(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	a := tbFile(t, dir, "a.txt", "a\n")
	tbFile(t, dir, "c.txt", "c\n")
	patch := "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-a\n+A\n--- a/c.txt\n+++ b/c.txt\n@@ -1 +1 @@\n-c\n+C\n"
	tc := &toolCall{ID: "c", Args: mustJSON(t, map[string]any{"patch": patch}), Output: func([]byte) {}}
	r := tb.runPatch(context.Background(), tc, &patchHooks{before: func(step int, path string) {
		if step == 1 {
			replaceWithDir(t, a)                           // a.txt cannot be put back
			replaceWithDir(t, filepath.Join(dir, "c.txt")) // c.txt cannot be replaced
		}
	}})
	text := tbText(t, r)
	if !r.IsError || !strings.Contains(text, "putting the files back failed for "+a) || !strings.Contains(text, "its old content is in "+dir+"/.a.txt.orig-") {
		t.Errorf("result = %s", text)
	}
	var s struct {
		Applied     bool     `json:"applied"`
		NotRestored []string `json:"not_restored"`
	}
	if err := json.Unmarshal(r.Structured, &s); err != nil || s.Applied || !slices.Equal(s.NotRestored, []string{a}) {
		t.Errorf("structured = %s (%v)", r.Structured, err)
	}
}

// replaceWithDir replaces the file at p with a directory that is not
// empty, which no rename or unlink of a file can replace.
func replaceWithDir(t *testing.T, p string) {
	t.Helper()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	tbFile(t, p, "inside", "x")
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func mapKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestPatchDiffRoundTrip applies diff -u output of random edits and
// compares the result with the file diff was given.
func TestPatchDiffRoundTrip(t *testing.T) {
	diffPath, err := exec.LookPath("diff")
	if err != nil {
		t.Skip("no diff program")
	}
	tb := tbNew(t)
	src := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 40 {
		oldText, newText := randomEdit(rng)
		names := fmt.Sprintf("r%d.txt", round)
		oldDir, newDir := filepath.Join(src, fmt.Sprint(round), "a"), filepath.Join(src, fmt.Sprint(round), "b")
		tbFile(t, oldDir, names, oldText)
		tbFile(t, newDir, names, newText)
		tbFile(t, tb.cfg.Cwd, names, oldText)
		cmd := exec.Command(diffPath, "-ruN", "a", "b")
		cmd.Dir = filepath.Dir(oldDir)
		out, err := cmd.Output()
		if err != nil && cmd.ProcessState.ExitCode() != 1 {
			t.Fatalf("diff: %v", err)
		}
		if len(out) == 0 {
			continue
		}
		r := patchCall(t, tb, string(out), false)
		if r.IsError {
			t.Fatalf("round %d: %s\npatch:\n%s", round, tbText(t, r), out)
		}
		if got := tbRead(t, filepath.Join(tb.cfg.Cwd, names)); got != newText {
			t.Fatalf("round %d: result %q, want %q\npatch:\n%s", round, got, newText, out)
		}
	}
}

// randomEdit returns a text and a random edit of it, with CRLF lines
// and missing final newlines now and then.
func randomEdit(rng *rand.Rand) (string, string) {
	words := []string{"alpha", "beta", "gamma", "delta", "", "}", "{", "return x"}
	eol := "\n"
	if rng.IntN(4) == 0 {
		eol = "\r\n"
	}
	var lines []string
	for range rng.IntN(60) {
		lines = append(lines, words[rng.IntN(len(words))])
	}
	edited := slices.Clone(lines)
	for range rng.IntN(6) {
		i := rng.IntN(len(edited) + 1)
		switch rng.IntN(3) {
		case 0:
			edited = slices.Insert(edited, i, fmt.Sprintf("inserted %d", rng.IntN(100)))
		case 1:
			if i < len(edited) {
				edited = slices.Delete(edited, i, i+1)
			}
		default:
			if i < len(edited) {
				edited[i] = "changed " + edited[i]
			}
		}
	}
	join := func(ls []string) string {
		s := strings.Join(ls, eol)
		if len(ls) > 0 && rng.IntN(5) > 0 {
			s += eol
		}
		return s
	}
	return join(lines), join(edited)
}

// FuzzApplyPatch runs the patch tool on a small tree: it never panics,
// changes only files the patch names, and leaves no temporary files.
func FuzzApplyPatch(f *testing.F) {
	f.Add("a\nb\nc\n", "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n", false)
	f.Add("x\r\ny", "--- a/sub/b.txt\n+++ b/sub/b.txt\n@@ -1,2 +1,2 @@\n x\n-y\n\\ No newline at end of file\n+z\n", false)
	f.Add("", "--- /dev/null\n+++ b/sub/new/c.txt\n@@ -0,0 +1 @@\n+n\n--- a/a.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-q\n", true)
	f.Add("x\r\ny\r\n", "diff --git a/a.txt b/a.txt\nindex 0aa0f34..1525a06 100644\n--- a/a.txt\n+++ b/a.txt\n@@ -1,2 +1,2 @@\n x\r\n-y\r\n+z\r\n"+
		"diff -ruN a/sub/b.txt b/sub/b.txt\n--- a/sub/b.txt\t2026-11-30 04:51:07.980739103 +0000\n+++ b/sub/b.txt\t1970-01-01 00:00:00.000000000 +0000\n@@ -1,2 +0,0 @@\n-x\r\n-y\r\n", false)
	f.Fuzz(func(t *testing.T, content, patch string, dryRun bool) {
		files, err := unidiff.Parse(patch)
		named := map[string]bool{}
		for _, fp := range files {
			if !filepath.IsLocal(fp.Path) {
				return // stay inside the test's directory
			}
			named[filepath.Clean(fp.Path)] = true
		}
		g := tbPolicy(t, `paths: {allow: ["CWD/**"]}`)
		g.file(t, "a.txt", content)
		g.file(t, "sub/b.txt", content)
		before := treeState(t, g.cwd)
		r, _ := tbCall(t, context.Background(), g.toolbox, "patch", map[string]any{"patch": patch, "dry_run": dryRun})
		after := treeState(t, g.cwd)
		if err != nil && (!r.IsError || r.Structured != nil) {
			t.Fatalf("unparsable patch gave %+v", r)
		}
		changed := !r.IsError && !dryRun
		for p, v := range after {
			if before[p] == v {
				continue
			}
			if !changed {
				t.Fatalf("%s changed by a patch that failed or was a dry run", p)
			}
			if v == "<dir>" && before[p] == "" {
				continue // a directory made for a new file
			}
			if !named[p] {
				t.Fatalf("%s changed but the patch does not name it", p)
			}
			if strings.Contains(filepath.Base(p), ".tmp-") || strings.Contains(filepath.Base(p), ".orig-") {
				t.Fatalf("left behind %s", p)
			}
		}
		for p := range before {
			if _, ok := after[p]; !ok && (!changed || !named[p]) {
				t.Fatalf("%s removed", p)
			}
		}
		if r.Error == nil && len(r.Structured) > 0 && !bytes.HasPrefix(r.Structured, []byte("{")) {
			t.Fatalf("structured = %s", r.Structured)
		}
	})
}

// A file of many short lines takes far more memory once split than its
// bytes: the files a patch reads are bounded in lines as well as bytes.
func TestPatchLineBudget(t *testing.T) {
	tb := tbNew(t)
	dir := tb.cfg.Cwd
	n := maxPatchFileLines
	big := tbFile(t, dir, "big.txt", strings.Repeat("\n", n)+"x\n")
	tbFile(t, dir, "small.txt", "a\n")
	before := treeState(t, dir)
	patch := "--- a/small.txt\n+++ b/small.txt\n@@ -1 +1 @@\n-a\n+b\n" +
		"--- a/big.txt\n+++ b/big.txt\n@@ -" + itoa(n+1) + ",1 +" + itoa(n+1) + ",1 @@\n-x\n+y\n"
	r := run(t, tb, "patch", map[string]any{"patch": patch})
	wantFailure(t, "patch a file of too many lines", r, big+": the files this patch touches have more than 4194304 lines in all")
	wantFailure(t, "patch a file of too many lines", r, "nothing was changed")
	sameTree(t, dir, before)
}
