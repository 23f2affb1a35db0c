package unidiff

import (
	"context"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// gitPatch is what git diff writes for a CRLF file changed, an empty
// file added and a file whose name has a space.
const gitPatch = "diff --git a/crlf.txt b/crlf.txt\n" +
	"index 0aa0f34..1525a06 100644\n" +
	"--- a/crlf.txt\n" +
	"+++ b/crlf.txt\n" +
	"@@ -1,2 +1,2 @@\n" +
	" x\r\n" +
	"-y\r\n" +
	"+z\r\n" +
	"diff --git a/empty b/empty\n" +
	"new file mode 100644\n" +
	"index 0000000..e69de29\n" +
	"diff --git a/sp ace.txt b/sp ace.txt\n" +
	"index b2901ea..6435bc0 100644\n" +
	"--- a/sp ace.txt\t\n" +
	"+++ b/sp ace.txt\t\n" +
	"@@ -1 +1 @@ func main() {\n" +
	"-a b\n" +
	"+a c\n"

// plainPatch is what diff -ruN writes for a deleted, an added and a
// changed file.
const plainPatch = "diff -ruN a/del.txt b/del.txt\n" +
	"--- a/del.txt\t2026-11-30 04:51:07.980739103 +0000\n" +
	"+++ b/del.txt\t1970-01-01 00:00:00.000000000 +0000\n" +
	"@@ -1 +0,0 @@\n" +
	"-gone\n" +
	"diff -ruN a/new.txt b/new.txt\n" +
	"--- a/new.txt\t1970-01-01 00:00:00.000000000 +0000\n" +
	"+++ b/new.txt\t2026-11-30 04:51:07.980739103 +0000\n" +
	"@@ -0,0 +1 @@\n" +
	"+new\n" +
	"diff -ruN a/x.txt b/x.txt\n" +
	"--- a/x.txt\t2026-11-30 04:51:07.980739103 +0000\n" +
	"+++ b/x.txt\t2026-11-30 04:51:07.980739103 +0000\n" +
	"@@ -1,3 +1,4 @@\n" +
	" one\n" +
	"-two\n" +
	"+2\n" +
	" three\n" +
	"+four\n" +
	"\\ No newline at end of file\n"

// stripLines zeroes the patch line numbers, which a round trip moves.
func stripLines(files []*File) []*File {
	out := make([]*File, len(files))
	for i, fp := range files {
		c := *fp
		c.Line = 0
		c.Hunks = append([]Hunk(nil), fp.Hunks...)
		for j := range c.Hunks {
			c.Hunks[j].Line = 0
		}
		out[i] = &c
	}
	return out
}

func TestParsePatch(t *testing.T) {
	tests := []struct {
		name, patch string
		want        []*File
	}{
		{"git", gitPatch, []*File{
			{Path: "crlf.txt", Hunks: []Hunk{{OldStart: 1, OldLines: 2, NewStart: 1, NewLines: 2, Lines: []HunkLine{{' ', "x\r", false}, {'-', "y\r", false}, {'+', "z\r", false}}}}},
			{Path: "empty", Op: Create, Mode: 0o644},
			{Path: "sp ace.txt", Hunks: []Hunk{{OldStart: 1, OldLines: 1, NewStart: 1, NewLines: 1, Section: "func main() {", Lines: []HunkLine{{'-', "a b", false}, {'+', "a c", false}}}}},
		}},
		{"diff -ruN", plainPatch, []*File{
			{Path: "del.txt", Op: Delete, Hunks: []Hunk{{OldStart: 1, OldLines: 1, NewStart: 0, NewLines: 0, Lines: []HunkLine{{'-', "gone", false}}}}},
			{Path: "new.txt", Op: Create, Hunks: []Hunk{{OldStart: 0, OldLines: 0, NewStart: 1, NewLines: 1, Lines: []HunkLine{{'+', "new", false}}}}},
			{Path: "x.txt", Hunks: []Hunk{{OldStart: 1, OldLines: 3, NewStart: 1, NewLines: 4, Lines: []HunkLine{
				{' ', "one", false}, {'-', "two", false}, {'+', "2", false}, {' ', "three", false}, {'+', "four", true}}}}},
		}},
		{"plain names, preamble, blank context line, signature",
			"Subject: fix\n\nSome words.\n---\n x.txt | 2 +-\n\n--- x.txt\n+++ x.txt\n@@ -1,3 +1,3 @@\n a\n\n-b\n+c\n-- \n2.40.0\n",
			[]*File{{Path: "x.txt", Hunks: []Hunk{{OldStart: 1, OldLines: 3, NewStart: 1, NewLines: 3, Lines: []HunkLine{
				{' ', "a", false}, {' ', "", false}, {'-', "b", false}, {'+', "c", false}}}}}},
		},
		{"git creation with mode and /dev/null",
			"diff --git a/bin/run b/bin/run\nnew file mode 100755\nindex 0000000..1111111\n--- /dev/null\n+++ b/bin/run\n@@ -0,0 +1,2 @@\n+#!/bin/sh\n+echo hi\n",
			[]*File{{Path: "bin/run", Op: Create, Mode: 0o755, Hunks: []Hunk{{NewStart: 1, NewLines: 2, Lines: []HunkLine{{'+', "#!/bin/sh", false}, {'+', "echo hi", false}}}}}},
		},
		{"git deletion of an empty file", "diff --git a/e b/e\ndeleted file mode 100644\nindex e69de29..0000000\n",
			[]*File{{Path: "e", Op: Delete}}},
		{"quoted names", "--- \"a/t\\tab \\303\\251.txt\"\n+++ \"b/t\\tab \\303\\251.txt\"\n@@ -1 +1 @@\n-a\n+b\n",
			[]*File{{Path: "t\tab é.txt", Hunks: []Hunk{{OldStart: 1, OldLines: 1, NewStart: 1, NewLines: 1, Lines: []HunkLine{{'-', "a", false}, {'+', "b", false}}}}}}},
		{"patch with CRLF line endings", "--- a/w.txt\r\n+++ b/w.txt\r\n@@ -1,2 +1,2 @@\r\n-a\r\n+b\r\n c\r\n",
			[]*File{{Path: "w.txt", Hunks: []Hunk{{OldStart: 1, OldLines: 2, NewStart: 1, NewLines: 2, Lines: []HunkLine{{'-', "a", false}, {'+', "b", false}, {' ', "c", false}}}}}}},
		{"no newline on both sides of a context line", "--- f\n+++ f\n@@ -1,2 +1,2 @@\n-a\n+b\n c\n\\ No newline at end of file\n",
			[]*File{{Path: "f", Hunks: []Hunk{{OldStart: 1, OldLines: 2, NewStart: 1, NewLines: 2, Lines: []HunkLine{{'-', "a", false}, {'+', "b", false}, {' ', "c", true}}}}}}},
		{"removed line without newline", "--- f\n+++ f\n@@ -1 +1 @@\n-a\n\\ No newline at end of file\n+a\n",
			[]*File{{Path: "f", Hunks: []Hunk{{OldStart: 1, OldLines: 1, NewStart: 1, NewLines: 1, Lines: []HunkLine{{'-', "a", true}, {'+', "a", false}}}}}}},
		{"two files, two hunks each, a/ b/ kept when only one side has it",
			"--- a/p\n+++ c/p\n@@ -1 +1 @@\n-x\n+y\n",
			nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.patch)
			if tt.want == nil {
				if err == nil {
					t.Fatalf("parsed %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, want := stripLines(got), tt.want; !reflect.DeepEqual(got, want) {
				for i := range max(len(got), len(want)) {
					if i < len(got) && i < len(want) && !reflect.DeepEqual(got[i], want[i]) {
						t.Errorf("file %d = %+v\nwant     %+v", i, *got[i], *want[i])
					}
				}
				if len(got) != len(want) {
					t.Errorf("%d files, want %d", len(got), len(want))
				}
			}
			// What Format writes parses as the same patch.
			again, err := Parse(Format(got))
			if err != nil {
				t.Fatalf("formatted patch does not parse: %v\n%s", err, Format(got))
			}
			if !reflect.DeepEqual(stripLines(again), stripLines(got)) {
				t.Errorf("round trip changed the patch:\n%s", Format(got))
			}
		})
	}
}

func TestParsePatchErrors(t *testing.T) {
	hdr := "--- a/f\n+++ b/f\n"
	tests := []struct{ name, patch, want string }{
		{"empty", "just words\n", "no file changes found"},
		{"rename", "diff --git a/old b/new\nsimilarity index 100%\nrename from old\nrename to new\n", "patch line 3: renames are not supported (rename from old); move the file with the move tool"},
		{"copy", "diff --git a/a b/b\ncopy from a\ncopy to b\n", "copies are not supported"},
		{"git binary", "diff --git a/i.png b/i.png\nindex 1..2 100644\nGIT binary patch\nliteral 5\n", "binary patches are not supported"},
		{"plain binary", "Binary files a/i.png and b/i.png differ\n", "binary patches are not supported (Binary files a/i.png and b/i.png differ); write the file's new content with the write tool"},
		{"mode change", "diff --git a/s b/s\nold mode 100644\nnew mode 100755\n", "changes the mode of s (100644 → 100755)"},
		{"too few lines", hdr + "@@ -1,3 +1,3 @@\n a\n-b\n+c\nnot a hunk line\n", "patch line 7: hunk @@ -1,3 +1,3 @@ ends early: its header counts 3 old and 3 new lines, the hunk has 2 and 2 before this line"},
		{"ends at end of patch", hdr + "@@ -1,3 +1,3 @@\n a\n", "ends early at the end of the patch"},
		{"too many lines", hdr + "@@ -1,2 +1,2 @@\n a\n-b\n+c\n+d\n", `patch line 7: "+d" follows a complete hunk: the previous @@ header counts fewer lines than the hunk has`},
		{"one side over", hdr + "@@ -1,1 +1,2 @@\n a\n-b\n+c\n", "has more lines than its header counts (1 old, 2 new)"},
		{"hunk without header", "@@ -1 +1 @@\n-a\n+b\n", "comes before any ---/+++ file header"},
		{"--- without +++", "--- a/f\n@@ -1 +1 @@\n", "a --- line must be followed by a +++ line"},
		{"different names", "--- a/f\n+++ b/g\n@@ -1 +1 @@\n-a\n+b\n", "--- names f but +++ names g"},
		{"both /dev/null", "--- /dev/null\n+++ /dev/null\n@@ -0,0 +0,0 @@\n", "both --- and +++ are /dev/null"},
		{"no hunks", hdr + "\n", "the section for f has no @@ hunks"},
		{"bad header", hdr + "@@ -x +1 @@\n", `"@@ -x +1 @@" is not a hunk header`},
		{"line zero", hdr + "@@ -0,2 +1,2 @@\n a\n b\n", "lines are numbered from 1"},
		{"misplaced no-newline", hdr + "@@ -1,2 +1,2 @@\n a\n\\ No newline at end of file\n-b\n+c\n", `follows " a", which is not the last line`},
		{"double no-newline", hdr + "@@ -1 +1 @@\n-a\n\\ No newline at end of file\n\\ No newline at end of file\n+b\n", "must follow a hunk line"},
		{"out of order", hdr + "@@ -5 +5 @@\n-a\n+b\n@@ -2 +2 @@\n-c\n+d\n", "starts before the previous hunk ends (old line 5)"},
		{"overlap", hdr + "@@ -1,3 +1,3 @@\n a\n-b\n+c\n d\n@@ -3 +3 @@\n-d\n+e\n", "starts before the previous hunk ends"},
		{"create with old lines", "--- /dev/null\n+++ b/n\n@@ -1 +1 @@\n-a\n+b\n", "n is created (--- /dev/null), so it takes one hunk"},
		{"delete adding lines", "--- a/d\n+++ /dev/null\n@@ -1 +1 @@\n-a\n+b\n", "d is deleted (+++ /dev/null), so its hunks add nothing"},
		{"no-newline before another hunk", hdr + "@@ -1 +1 @@\n-a\n+b\n\\ No newline at end of file\n@@ -5 +5 @@\n-c\n+d\n", "but more hunks follow"},
		{"bad quoted name", "--- \"a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n", "--- line: the quoted file name is not closed"},
		{"empty name", "--- \n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n", "the file name is missing"},
		{"bad mode", "diff --git a/f b/f\nnew file mode rwx\n", `"rwx" is not a file mode`},
		{"git header alone", "diff --git a/f b/f\nindex 1..2\n", "has no ---/+++ lines and no hunks"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files, err := Parse(tt.patch)
			if err == nil {
				t.Fatalf("parsed %+v, want an error", files)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %q\nwant it to contain %q", err, tt.want)
			}
		})
	}
}

func TestParsePatchLimits(t *testing.T) {
	var b strings.Builder
	for i := range maxPatchFiles + 1 {
		b.WriteString("--- a/f" + strings.Repeat("x", i%7) + "\n+++ b/f" + strings.Repeat("x", i%7) + "\n@@ -1 +1 @@\n-a\n+b\n")
	}
	if _, err := Parse(b.String()); err == nil || !strings.Contains(err.Error(), "more than 1000 files") {
		t.Errorf("1001 files: %v", err)
	}
	big := "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+" + strings.Repeat("x", maxPatchBytes) + "\n"
	if _, err := Parse(big); err == nil || !strings.Contains(err.Error(), "exceeds the limit of 16777216 bytes (16 MiB)") {
		t.Errorf("oversized patch: %v", err)
	}
	// Each line costs far more memory than its bytes: the line count is
	// bounded too, before the text is split.
	long := "--- /dev/null\n+++ b/f\n@@ -0,0 +1," + strconv.Itoa(maxPatchLines) + " @@\n" + strings.Repeat("+\n", maxPatchLines)
	if _, err := Parse(long); err == nil || !strings.Contains(err.Error(), "more than 1048576 lines; split it into several patches") {
		t.Errorf("a patch of too many lines: %v", err)
	}
}

// applyText applies a one-file patch to content and returns the result
// and the hunk reports.
func applyText(t *testing.T, content, patch string) (string, []HunkResult) {
	t.Helper()
	files, err := Parse(patch)
	if err != nil {
		t.Fatal(err)
	}
	res := Apply(context.Background(), SplitText(content), files[0])
	if res.Failed {
		return "", res.Hunks
	}
	return res.File.String(), res.Hunks
}

func TestApplySection(t *testing.T) {
	const ten = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"
	tests := []struct {
		name, content, patch, want string
		line, offset               int
		reason                     string
	}{
		{name: "exact", content: ten, patch: "--- f\n+++ f\n@@ -4,3 +4,3 @@\n 4\n-5\n+five\n 6\n",
			want: "1\n2\n3\n4\nfive\n6\n7\n8\n9\n10\n", line: 4},
		{name: "offset down", content: "0\n" + ten, patch: "--- f\n+++ f\n@@ -4,3 +4,3 @@\n 4\n-5\n+five\n 6\n",
			want: "0\n1\n2\n3\n4\nfive\n6\n7\n8\n9\n10\n", line: 5, offset: 1},
		{name: "offset up", content: "3\n4\n5\n6\n", patch: "--- f\n+++ f\n@@ -4,3 +4,3 @@\n 4\n-5\n+five\n 6\n",
			want: "3\n4\nfive\n6\n", line: 2, offset: -2},
		{name: "nearest of two", content: "x\na\nx\nx\nx\nx\na\n", patch: "--- f\n+++ f\n@@ -5 +5 @@\n-a\n+b\n",
			want: "x\na\nx\nx\nx\nx\nb\n", line: 7, offset: 2},
		{name: "ambiguous", content: "a\nx\na\n", patch: "--- f\n+++ f\n@@ -2,1 +2,1 @@\n-a\n+b\n",
			line: 2, reason: "ambiguous: the hunk matches at lines 1 and 3"},
		{name: "context differs", content: ten, patch: "--- f\n+++ f\n@@ -4,3 +4,3 @@\n 4\n-5\n+five\n 7\n",
			line: 4, reason: `not found: placed at line 4, its context line 3 (file line 6) differs: file has "6", patch expects "7"; the hunk matches nowhere else in the file`},
		{name: "removed line differs", content: ten, patch: "--- f\n+++ f\n@@ -4,2 +4,1 @@\n 4\n-6\n",
			line: 4, reason: `its removed line 2 (file line 5) differs: file has "5", patch expects "6"`},
		{name: "past the end", content: "a\n", patch: "--- f\n+++ f\n@@ -3,2 +3,1 @@\n a\n-b\n",
			line: 3, reason: "not found: the hunk needs 2 lines of the file but the file has 1"},
		{name: "insert at start", content: "a\n", patch: "--- f\n+++ f\n@@ -0,0 +1 @@\n+z\n", want: "z\na\n"},
		{name: "insert at end", content: "a\n", patch: "--- f\n+++ f\n@@ -1,0 +2 @@\n+z\n", want: "a\nz\n", line: 1},
		{name: "add a newline at end", content: "a\nb", patch: "--- f\n+++ f\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+b\n",
			want: "a\nb\n", line: 1},
		{name: "remove the newline at end", content: "a\nb\n", patch: "--- f\n+++ f\n@@ -1,2 +1,2 @@\n a\n-b\n+b\n\\ No newline at end of file\n",
			want: "a\nb", line: 1},
		{name: "file lacks the newline the patch expects", content: "a\nb", patch: "--- f\n+++ f\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n",
			line: 1, reason: "its removed line 2 (file line 2) has no newline at end of file; the patch expects one"},
		{name: "file has a newline the patch says it lacks", content: "a\nb\n", patch: "--- f\n+++ f\n@@ -2 +2 @@\n-b\n\\ No newline at end of file\n+c\n",
			line: 2, reason: "ends in a newline; the patch expects none"},
		{name: "adding after a line without newline", content: "a", patch: "--- f\n+++ f\n@@ -1,0 +2 @@\n+b\n",
			line: 1, reason: "the patch puts more lines after line 1 of the result, which has no newline at end of file"},
		{name: "no newline but the file goes on", content: "a\nb\nc\n", patch: "--- f\n+++ f\n@@ -1 +1 @@\n-a\n+x\n\\ No newline at end of file\n",
			line: 1, reason: "which has no newline at end of file"},
		{name: "CRLF file, LF patch", content: "a\r\nb\r\nc\r\n", patch: "--- f\n+++ f\n@@ -1,3 +1,4 @@\n a\n-b\n+B\n+B2\n c\n",
			want: "a\r\nB\r\nB2\r\nc\r\n", line: 1},
		{name: "CRLF file, CRLF lines in patch", content: "a\r\nb\r\n", patch: "--- f\n+++ f\n@@ -1,2 +1,2 @@\n a\r\n-b\r\n+c\r\n",
			want: "a\r\nc\r\n", line: 1},
		{name: "LF file, CR is content", content: "a\nb\n", patch: "--- f\n+++ f\n@@ -1,2 +1,2 @@\n a\n-b\n+c\r\n",
			want: "a\nc\r\n", line: 1},
		{name: "BOM kept", content: utf8BOM + "a\nb\n", patch: "--- f\n+++ f\n@@ -1,2 +1,2 @@\n-a\n+x\n b\n",
			want: utf8BOM + "x\nb\n", line: 1},
		{name: "BOM in the patch too", content: utf8BOM + "a\nb\n", patch: "--- f\n+++ f\n@@ -1,2 +1,2 @@\n-" + utf8BOM + "a\n+" + utf8BOM + "x\n b\n",
			want: utf8BOM + "x\nb\n", line: 1},
		{name: "two hunks, offset carried", content: "new\n" + ten, patch: "--- f\n+++ f\n@@ -1,2 +1,2 @@\n-1\n+one\n 2\n@@ -9,2 +9,2 @@\n 9\n-10\n+ten\n",
			want: "new\none\n2\n3\n4\n5\n6\n7\n8\n9\nten\n", line: 2, offset: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, hunks := applyText(t, tt.content, tt.patch)
			h := hunks[0]
			if tt.reason != "" {
				if h.OK || !strings.Contains(h.Reason, tt.reason) {
					t.Errorf("hunk = %+v\nwant a failure with %q", h, tt.reason)
				}
				if got != "" {
					t.Errorf("a failed patch produced %q", got)
				}
				if h.Line != tt.line {
					t.Errorf("line = %d, want %d", h.Line, tt.line)
				}
				return
			}
			if got != tt.want {
				t.Errorf("result = %q\nwant     %q (hunks %+v)", got, tt.want, hunks)
			}
			if !h.OK || h.Line != tt.line || h.Offset != tt.offset {
				t.Errorf("hunk = %+v, want line %d offset %d", h, tt.line, tt.offset)
			}
		})
	}
}

// TestApplyReportsEveryHunk: a failing hunk does not hide the ones after
// it, and they are placed as if it had applied.
func TestApplyReportsEveryHunk(t *testing.T) {
	_, hunks := applyText(t, "1\n2\n3\n4\n5\n6\n", "--- f\n+++ f\n@@ -1 +1 @@\n-x\n+y\n@@ -3 +3 @@\n-3\n+three\n@@ -5 +5 @@\n-z\n+w\n")
	if len(hunks) != 3 || hunks[0].OK || !hunks[1].OK || hunks[1].Line != 3 || hunks[2].OK {
		t.Errorf("hunks = %+v, want failed, applied at 3, failed", hunks)
	}
}

func TestSplitText(t *testing.T) {
	for _, s := range []string{"", "a", "a\n", "a\r\nb\r\n", "a\r\nb", "a\nb\r\nc\r\n", "\r\n", utf8BOM, utf8BOM + "x\r\n", "a\r", "a\rb\n"} {
		f := SplitText(s)
		if got := f.String(); got != s {
			t.Errorf("SplitText(%q).String() = %q", s, got)
		}
	}
	if f := SplitText("a\nb\r\nc\r\n"); !f.crlf || f.lines[0].end != "\n" || f.lines[1].text != "b" {
		t.Errorf("mostly CRLF: %+v", f)
	}
	if f := SplitText("a\nb\nc\r\n"); f.crlf || f.lines[2].text != "c\r" {
		t.Errorf("mostly LF: %+v", f)
	}
}

func FuzzParsePatch(f *testing.F) {
	f.Add(gitPatch)
	f.Add(plainPatch)
	f.Add("--- \"a/t\\tab\"\n+++ \"b/t\\tab\"\n@@ -1,2 +1 @@\n-a\n b\n\\ No newline at end of file\n")
	f.Add("diff --git a/x y b/x y\nnew file mode 100755\n")
	f.Add("--- /dev/null\n+++ b/n\n@@ -0,0 +1 @@\n+x\r\n")
	f.Add("--- a/w.txt\r\n+++ b/w.txt\r\n@@ -1,2 +1,2 @@ sec\r\n-a\r\n+b\r\n c\r\n")
	f.Fuzz(func(t *testing.T, text string) {
		files, err := Parse(text)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "patch") {
				t.Fatalf("error %q does not say where", err)
			}
			return
		}
		for _, fp := range files {
			if fp.Path == "" {
				t.Fatalf("file with no path: %+v", fp)
			}
			for _, h := range fp.Hunks {
				old, nw := 0, 0
				for _, l := range h.Lines {
					if l.Kind != '+' {
						old++
					}
					if l.Kind != '-' {
						nw++
					}
				}
				if old != h.OldLines || nw != h.NewLines {
					t.Fatalf("hunk %s has %d old and %d new lines", h.Header(), old, nw)
				}
			}
		}
		out := Format(files)
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("formatted patch does not parse: %v\n%q", err, out)
		}
		if !reflect.DeepEqual(stripLines(again), stripLines(files)) {
			t.Fatalf("round trip changed the patch:\n%q\n%q", text, out)
		}
		if out2 := Format(again); out2 != out {
			t.Fatalf("formatting is not stable:\n%q\n%q", out, out2)
		}
	})
}
