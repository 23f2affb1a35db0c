package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/agent/unidiff"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// maxPatchFileBytes bounds the content of the files one patch reads.
const maxPatchFileBytes = 256 << 20

// maxPatchFileLines bounds the lines of the files one patch reads: in
// memory each line costs about 70 bytes besides its text (it is held
// before and after the patch), so a file of short lines is bounded by
// this well before maxPatchFileBytes.
const maxPatchFileLines = 4 << 20

// patchTarget is one file a patch changes, with every section that
// names it.
type patchTarget struct {
	path     string // as resolved for messages
	target   string // the checked file to open
	key      string // its lock (Locks.Key)
	sections []*unidiff.File

	existed bool   // before the patch
	old     string // content before the patch
	exists  bool   // after the patch
	data    string // content after the patch
	mode    fs.FileMode
	problem string // why the file cannot be patched at all

	hunks          []unidiff.HunkResult
	added, removed int
	newSum         string // sum(), once computed
}

// sum returns the SHA-256 of the content after the patch.
func (pt *patchTarget) sum() string {
	if pt.newSum == "" {
		pt.newSum = sha256Hex([]byte(pt.data))
	}
	return pt.newSum
}

// action says what the patch does to the file.
func (pt *patchTarget) action() string {
	switch {
	case pt.existed && pt.exists:
		return "modified"
	case pt.exists:
		return "created"
	case pt.existed:
		return "deleted"
	}
	return "unchanged"
}

// failed reports whether the file cannot be patched.
func (pt *patchTarget) failed() bool {
	return pt.problem != "" || slices.ContainsFunc(pt.hunks, func(h unidiff.HunkResult) bool { return !h.OK })
}

// patchHooks reach into a commit, for tests: before runs ahead of each
// step that changes the tree (to make a step fail), at at each point of
// the commit ("staged", "backed-up", "rename" with the step about to
// run, "committed", "cleaned"; to stop a process there).
type patchHooks struct {
	before func(step int, path string)
	at     func(point string, step int)
}

// patch applies a unified diff to one or more files: all of it or
// nothing.
func (t *toolbox) patch(ctx context.Context, tc *toolCall) *protocol.Result {
	return t.runPatch(ctx, tc, nil)
}

func (t *toolbox) runPatch(ctx context.Context, tc *toolCall, hooks *patchHooks) *protocol.Result {
	var a protocol.PatchArgs
	if r := decodeArgs(tc, protocol.ToolPatch, &a); r != nil {
		return r
	}
	if strings.TrimSpace(a.Patch) == "" {
		return toolFailure(tc, "patch is empty; give a unified diff (the output of git diff or diff -u)")
	}
	files, err := unidiff.Parse(a.Patch)
	if err != nil {
		return toolFailure(tc, "%v; nothing was changed", err)
	}
	targets, r := t.patchTargets(tc, files)
	if r != nil {
		return r
	}
	keys := make([]string, len(targets))
	for i, pt := range targets {
		keys[i] = pt.target
	}
	// A commit a dead process left half done is finished or undone
	// before anything else touches its files.
	t.journals.recover()
	unlock, err := t.lockFiles(keys...)
	if err != nil {
		return toolFailure(tc, "patch: %v; nothing was changed", err)
	}
	defer unlock()
	if r := t.loadTargets(ctx, tc, targets); r != nil {
		return r
	}
	for _, pt := range targets {
		if ctx.Err() != nil {
			break
		}
		pt.apply(ctx)
	}
	if ctx.Err() != nil {
		return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "patch: cancelled; nothing was changed")
	}
	if slices.ContainsFunc(targets, (*patchTarget).failed) {
		return patchFailure(tc, targets, a.DryRun)
	}
	if a.DryRun {
		return patchSuccess(tc, targets, true)
	}
	if err := t.commitPatch(ctx, targets, hooks); err != nil {
		if errors.Is(err, errCancelled) {
			return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "patch: cancelled; nothing was changed")
		}
		r := toolFailure(tc, "%v", err)
		var unrestored []string
		if ce := (*commitError)(nil); errors.As(err, &ce) {
			unrestored = ce.unrestored
		}
		r.Structured = patchStructured(targets, false, false, unrestored...)
		return r
	}
	return patchSuccess(tc, targets, false)
}

// patchTargets resolves and checks the file of every section and groups
// the sections by file, in lock order. A path the host refuses refuses
// the whole patch.
func (t *toolbox) patchTargets(tc *toolCall, files []*unidiff.File) ([]*patchTarget, *protocol.Result) {
	byKey := map[string]*patchTarget{}
	var denied, bad []string
	for _, fp := range files {
		ops := []policy.Op{policy.Read, policy.Write}
		if fp.Op == unidiff.Create {
			ops = ops[1:]
		}
		path, err := t.resolve(fp.Path)
		if err != nil {
			bad = append(bad, fmt.Sprintf("%s (patch line %d): %v", fp.Path, fp.Line, err))
			continue
		}
		target, err := t.guard.checkPath(path, ops...)
		switch {
		case isDenied(err):
			denied = append(denied, err.Error())
			continue
		case err != nil:
			bad = append(bad, safefs.Problem(path, err))
			continue
		}
		key := t.locks.Key(target)
		pt := byKey[key]
		if pt == nil {
			pt = &patchTarget{path: path, target: target, key: key}
			byKey[key] = pt
		}
		pt.sections = append(pt.sections, fp)
	}
	switch {
	case len(denied) > 0:
		return nil, protocol.ErrorResult(tc.ID, protocol.CodeDenied, strings.Join(denied, "; ")+"; nothing was changed")
	case len(bad) > 0:
		return nil, toolFailure(tc, "the patch was not applied; nothing was changed:\n%s", strings.Join(bad, "\n"))
	}
	targets := make([]*patchTarget, 0, len(byKey))
	for _, pt := range byKey {
		targets = append(targets, pt)
	}
	slices.SortFunc(targets, func(a, b *patchTarget) int { return cmp.Compare(a.key, b.key) })
	return targets, nil
}

// loadTargets reads every file the patch touches. A file that cannot be
// read gets a problem; a refusal (the agent's credentials under another
// name) refuses the call.
func (t *toolbox) loadTargets(ctx context.Context, tc *toolCall, targets []*patchTarget) *protocol.Result {
	budget, lines := int64(maxPatchFileBytes), maxPatchFileLines
	for _, pt := range targets {
		exists, data, err := t.readPatchTarget(ctx, pt.path, pt.target, budget)
		if ctx.Err() != nil {
			return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "patch: cancelled; nothing was changed")
		}
		if isDenied(err) {
			return deniedResult(tc, fmt.Errorf("%w; nothing was changed", err))
		}
		if err != nil {
			pt.problem = err.Error()
			continue
		}
		n := strings.Count(data, "\n") + 1
		if n > lines {
			pt.problem = fmt.Sprintf("%s: the files this patch touches have more than %d lines in all; patch fewer or smaller files at a time, or change this one with bash (e.g. sed -i)", pt.path, maxPatchFileLines)
			continue
		}
		lines -= n
		budget -= int64(len(data))
		pt.existed, pt.old = exists, data
	}
	return nil
}

// readPatchTarget reads the text file at target, the resolved path of
// path, with at most budget bytes. A missing file is not an error.
func (t *toolbox) readPatchTarget(ctx context.Context, path, target string, budget int64) (exists bool, data string, err error) {
	d, err := safefs.OpenDir(filepath.Dir(target), false)
	if errors.Is(err, fs.ErrNotExist) {
		return false, "", nil
	}
	if err != nil {
		return false, "", problem(safefs.Problem(path, err))
	}
	_, err = d.Lstat(filepath.Base(target))
	d.Close()
	if errors.Is(err, fs.ErrNotExist) {
		return false, "", nil
	}
	f, br, err := t.openText(path, target, "patch works on text files only; use write for other files")
	if err != nil {
		return true, "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(ctxReader{ctx, br}, budget+1))
	if err != nil {
		return true, "", problem(safefs.Problem(path, err))
	}
	if int64(len(b)) > budget {
		return true, "", problem(fmt.Sprintf("%s: the files this patch touches hold more than %d MiB; patch fewer or smaller files at a time", path, maxPatchFileBytes>>20))
	}
	return true, string(b), nil
}

// apply applies the target's sections in order, in memory.
func (pt *patchTarget) apply(ctx context.Context) {
	if pt.problem != "" {
		return
	}
	pt.exists, pt.data = pt.existed, pt.old
	for _, fp := range pt.sections {
		switch {
		case fp.Op == unidiff.Create && pt.exists:
			pt.problem = fmt.Sprintf("%s already exists, but the patch creates it (--- /dev/null, patch line %d); to change it, name it on the --- line too, or delete it first", pt.path, fp.Line)
			return
		case fp.Op != unidiff.Create && !pt.exists:
			pt.problem = fmt.Sprintf("%s: no such file (patch line %d); a patch that creates a file has --- /dev/null", pt.path, fp.Line)
			return
		}
		var before unidiff.Text
		if fp.Op != unidiff.Create {
			before = unidiff.SplitText(pt.data)
		}
		res := unidiff.Apply(ctx, before, fp)
		pt.hunks = append(pt.hunks, res.Hunks...)
		pt.added += res.Added
		pt.removed += res.Removed
		if res.Failed {
			return
		}
		pt.data = res.File.String()
		switch fp.Op {
		case unidiff.Create:
			pt.exists, pt.mode = true, fp.Mode
		case unidiff.Delete:
			if n := res.File.Lines(); n > 0 {
				pt.problem = fmt.Sprintf("%s: the patch deletes it (+++ /dev/null) but leaves %d of its lines unremoved; a deletion must remove every line (to change only some lines, name the file on the +++ line)", pt.path, n)
				return
			}
			pt.exists, pt.data = false, ""
		}
	}
}

// patchFile is one file of the structured result.
type patchFile struct {
	Path    string               `json:"path"`
	Action  string               `json:"action"`
	Hunks   []unidiff.HunkResult `json:"hunks"`
	Added   int                  `json:"added"`
	Removed int                  `json:"removed"`
	SHA256  string               `json:"sha256,omitempty"`
	Error   string               `json:"error,omitempty"`
}

// patchStructured is the structured result; unrestored lists the files
// a failed commit could not put back.
func patchStructured(targets []*patchTarget, dryRun, applied bool, unrestored ...string) json.RawMessage {
	files := make([]patchFile, len(targets))
	for i, pt := range targets {
		f := patchFile{Path: pt.path, Action: pt.action(), Hunks: pt.hunks, Added: pt.added, Removed: pt.removed, Error: pt.problem}
		if f.Hunks == nil {
			f.Hunks = []unidiff.HunkResult{}
		}
		if pt.exists && !pt.failed() {
			f.SHA256 = pt.sum()
		}
		if pt.failed() {
			f.Action = "failed"
		}
		files[i] = f
	}
	out := map[string]any{"dry_run": dryRun, "applied": applied, "files": files}
	if len(unrestored) > 0 {
		out["not_restored"] = unrestored
	}
	data, _ := json.Marshal(out)
	return data
}

// patchSuccess reports a patch that applies.
func patchSuccess(tc *toolCall, targets []*patchTarget, dryRun bool) *protocol.Result {
	var b strings.Builder
	added, removed := 0, 0
	for _, pt := range targets {
		added += pt.added
		removed += pt.removed
	}
	if dryRun {
		fmt.Fprintf(&b, "Dry run: the patch applies cleanly to %s (+%d -%d); nothing was written.\n", counted(len(targets), "file"), added, removed)
	} else {
		fmt.Fprintf(&b, "Patched %s (+%d -%d).\n", counted(len(targets), "file"), added, removed)
	}
	for _, pt := range targets {
		fmt.Fprintf(&b, "%s %s: %s, +%d -%d\n", pt.action(), pt.path, counted(len(pt.hunks), "hunk"), pt.added, pt.removed)
		for i, h := range pt.hunks {
			if dryRun || h.Offset != 0 {
				fmt.Fprintf(&b, "  hunk %d %s: %s\n", i+1, h.Hunk, hunkPlace(h, dryRun))
			}
		}
	}
	r := toolText(tc, capLines(b.String()))
	r.Structured = patchStructured(targets, dryRun, !dryRun)
	return r
}

// maxPatchReportLines bounds the lines of a patch result's text; the
// structured result has every file and hunk.
const maxPatchReportLines = 500

// capLines trims the final newline of a report and cuts it to
// maxPatchReportLines lines.
func capLines(s string) string {
	s = strings.TrimSuffix(s, "\n")
	lines := strings.SplitAfterN(s, "\n", maxPatchReportLines+1)
	if len(lines) <= maxPatchReportLines {
		return s
	}
	more := strings.Count(lines[maxPatchReportLines], "\n") + 1
	return strings.Join(lines[:maxPatchReportLines], "") + fmt.Sprintf("[%d more lines; the structured result lists every file and hunk]", more)
}

// patchFailure reports a patch that does not apply: every file that
// cannot be patched and every hunk that fails.
func patchFailure(tc *toolCall, targets []*patchTarget, dryRun bool) *protocol.Result {
	var b strings.Builder
	failedHunks, total := 0, 0
	for _, pt := range targets {
		total += len(pt.hunks)
		for _, h := range pt.hunks {
			if !h.OK {
				failedHunks++
			}
		}
	}
	if dryRun {
		b.WriteString("Dry run: the patch does not apply; nothing was written.")
	} else {
		b.WriteString("The patch was not applied; nothing was changed.")
	}
	if failedHunks > 0 {
		fmt.Fprintf(&b, " %d of %s failed.", failedHunks, counted(total, "hunk"))
	}
	b.WriteString("\n")
	for _, pt := range targets {
		if pt.problem != "" {
			fmt.Fprintf(&b, "%s\n", pt.problem)
		}
		for i, h := range pt.hunks {
			switch {
			case !h.OK:
				fmt.Fprintf(&b, "%s: hunk %d %s: %s\n", pt.path, i+1, h.Hunk, h.Reason)
			case dryRun:
				fmt.Fprintf(&b, "%s: hunk %d %s: %s\n", pt.path, i+1, h.Hunk, hunkPlace(h, true))
			}
		}
	}
	r := toolFailure(tc, "%s", capLines(b.String()))
	r.Structured = patchStructured(targets, dryRun, false)
	return r
}

// hunkPlace says where a hunk applies.
func hunkPlace(h unidiff.HunkResult, dryRun bool) string {
	verb := "applied"
	if dryRun {
		verb = "applies"
	}
	s := fmt.Sprintf("%s at line %d", verb, h.Line)
	switch {
	case h.Insert && h.Line == 0:
		s = verb + " at the start of the file"
	case h.Insert:
		s = fmt.Sprintf("%s after line %d", verb, h.Line)
	}
	switch {
	case h.Offset > 0:
		s += fmt.Sprintf(" (offset +%d %s)", h.Offset, pluralWord(h.Offset, "line"))
	case h.Offset < 0:
		s += fmt.Sprintf(" (offset %d %s)", h.Offset, pluralWord(-h.Offset, "line"))
	}
	return s
}

func counted(n int, word string) string {
	return fmt.Sprintf("%d %s", n, pluralWord(n, word))
}

func pluralWord(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
