package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// edit applies exact-text replacements to a file: all of them or none.
// With expected_sha256 it edits only that version of the file.
func (t *toolbox) edit(ctx context.Context, tc *toolCall) *protocol.Result {
	var a protocol.EditArgs
	if r := decodeArgs(tc, protocol.ToolEdit, &a); r != nil {
		return r
	}
	switch {
	case a.Path == "":
		return toolFailure(tc, "path is empty; give the file to edit")
	case len(a.Edits) == 0:
		return toolFailure(tc, "edits is empty; give at least one {old_string, new_string}")
	}
	want, r := expectedHash(tc, a.ExpectedSHA256)
	if r != nil {
		return r
	}
	path, target, r := t.checkedPath(tc, a.Path, policy.Read, policy.Write)
	if r != nil {
		return r
	}
	unlock, err := t.lockFile(target)
	if err != nil {
		return toolFailure(tc, "%v; nothing was changed", err)
	}
	defer unlock()

	content, err := t.loadText(path, target)
	if err != nil {
		if _, serr := os.Lstat(target); want != "" && errors.Is(serr, fs.ErrNotExist) {
			return casMismatch(tc, path, want, "")
		}
		return textFailure(tc, err)
	}
	if want != "" {
		if got := sha256Hex([]byte(content)); got != want {
			return casMismatch(tc, path, want, got)
		}
	}
	edited, n, err := applyEdits(ctx, content, path, a.Edits)
	if ctx.Err() != nil {
		return protocol.ErrorResult(tc.ID, protocol.CodeCancelled, "edit: cancelled; nothing was changed")
	}
	if err != nil {
		return toolFailure(tc, "%v", err)
	}
	data := []byte(edited)
	if err := writeFileAtomic(target, data); err != nil {
		return toolFailure(tc, "%v", err)
	}
	res := toolText(tc, fmt.Sprintf("Successfully applied %d edit(s) to %s (%d replacement(s))", len(a.Edits), path, n))
	res.Structured, _ = json.Marshal(map[string]any{"path": path, "sha256": sha256Hex(data)})
	return res
}

// maxEditFileBytes bounds the files edit reads and writes: it holds a
// file in memory several times over. It is the largest file a write call
// carries by default (the agent's MaxRequestBytes).
const maxEditFileBytes = 64 << 20

// loadText returns the content of the text file at target, the resolved
// path of path, of at most maxEditFileBytes.
func (t *toolbox) loadText(path, target string) (string, error) {
	f, br, err := t.openText(path, target, "edit works on text files only")
	if err != nil {
		return "", err
	}
	defer f.Close()
	tooLarge := func(size int64) error {
		return problem(fmt.Sprintf("%s is %s (%d bytes); edit works on files up to %s. Use patch, or bash (e.g. sed -i), for it",
			path, humanSize(size), size, humanSize(maxEditFileBytes)))
	}
	if fi, err := f.Stat(); err == nil && fi.Size() > maxEditFileBytes {
		return "", tooLarge(fi.Size())
	}
	data, err := io.ReadAll(io.LimitReader(br, maxEditFileBytes+1))
	if err != nil {
		return "", problem(safefs.Problem(path, err))
	}
	if len(data) > maxEditFileBytes {
		return "", tooLarge(int64(len(data)))
	}
	return string(data), nil
}

// applyEdits applies edits to content in order, each to the result of the
// ones before, and returns the edited content and the number of
// replacements made. Each old_string must occur exactly once unless its
// edit sets replace_all. The error names the first edit that fails and,
// for a mismatch, path.
//
// Line endings and a byte order mark stay as they were. The text is
// matched in lfText form, so an old_string written with "\n" matches
// lines that end "\r\n". A line break in new_string takes the ending
// of the line where the text it replaces starts: in a file of CRLF lines
// every line stays CRLF, and in a file of mixed endings the text outside
// the replacements keeps its bytes. In text without a line break (left so
// by an earlier edit, say) line breaks are written "\n". A UTF-8 byte order mark at the start
// of the file is not part of the text matched and is kept.
//
// The edits are applied in about the time of a few passes over the
// content however many there are (see editEngine); ctx is checked
// between edits and within every pass.
func applyEdits(ctx context.Context, content, path string, edits []protocol.EditOp) (string, int, error) {
	return applyEditsWithin(ctx, content, path, edits, defaultEditLimits())
}

// applyEditsWithin is applyEdits with the engine's limits given.
func applyEditsWithin(ctx context.Context, content, path string, edits []protocol.EditOp, lim editLimits) (string, int, error) {
	bom := ""
	if strings.HasPrefix(content, utf8BOM) {
		bom, content = utf8BOM, content[len(utf8BOM):]
	}
	e := newEditEngine(ctx, content, lim)
	total := 0
	for i, ed := range edits {
		if err := ctx.Err(); err != nil {
			return "", 0, err
		}
		which := fmt.Sprintf("edit %d of %d", i+1, len(edits))
		old, new := editTexts(ed, bom != "")
		if old == "" {
			return "", 0, fmt.Errorf("%s: old_string is empty; give the exact text to replace", which)
		}
		if new == old {
			return "", 0, fmt.Errorf("%s: new_string equals old_string, so the edit makes no change", which)
		}
		r := e.apply(edits, i, old, new, bom != "", func(n int) error {
			switch {
			case n == 0:
				return fmt.Errorf("%s: old_string not found in %s", which, path)
			case n > 1 && !ed.ReplaceAll:
				return fmt.Errorf("%s: old_string matches %d times in %s; add surrounding context to make it unique, or set replace_all", which, n, path)
			}
			times := 1
			if ed.ReplaceAll {
				times = n
			}
			// A line break in new may become "\r\n".
			if size := len(bom) + e.size + times*(len(new)+strings.Count(new, "\n")-len(old)); size > maxEditFileBytes {
				return fmt.Errorf("%s: the result would be up to %s (%d replacements), more than edit writes (%s); make fewer or smaller replacements at a time",
					which, humanSize(int64(size)), times, humanSize(maxEditFileBytes))
			}
			return nil
		})
		if r.err != nil {
			return "", 0, r.err
		}
		total += r.n
	}
	if err := ctx.Err(); err != nil {
		return "", 0, err
	}
	return bom + e.text(), total, nil
}

// utf8BOM is the byte order mark some editors put at the start of UTF-8
// files.
const utf8BOM = "\uFEFF"

// eolDoc is a text together with its lfText form.
type eolDoc struct {
	text string
	norm string // lfText(text)
	crlf []int  // the positions in norm of the '\n's that follow a removed '\r', ascending
}

func newEOLDoc(text string) eolDoc {
	d := eolDoc{text: text, norm: text}
	if !strings.Contains(text, "\r\n") {
		return d
	}
	var b strings.Builder
	b.Grow(len(text))
	for i := 0; ; {
		j := strings.Index(text[i:], "\r\n")
		if j < 0 {
			b.WriteString(text[i:])
			break
		}
		b.WriteString(text[i : i+j])
		d.crlf = append(d.crlf, b.Len())
		b.WriteByte('\n')
		i += j + 2
	}
	d.norm = b.String()
	return d
}

// pos maps a position in norm to the same place in text. A '\n' whose
// '\r' was removed maps to the '\r', so a range of norm never splits a
// "\r\n" of text.
func (d eolDoc) pos(i int) int {
	return i + sort.SearchInts(d.crlf, i)
}

// replace replaces old, in lfText form, with new, in lfText form: the
// first occurrence in norm, or all of them. See applyEdits for the line
// endings new gets.
func (d eolDoc) replace(old, new string, all bool) string {
	if len(d.crlf) == 0 {
		if all {
			return strings.ReplaceAll(d.text, old, new)
		}
		return strings.Replace(d.text, old, new, 1)
	}
	crlfNew := strings.ReplaceAll(new, "\n", "\r\n")
	lastNL := strings.LastIndexByte(d.text, '\n') // there is one: text has a "\r\n"
	var b strings.Builder
	b.Grow(len(d.text))
	prev, after := 0, -1 // after: the first '\n' at or after the last start looked at
	for i := 0; ; {
		j := strings.Index(d.norm[i:], old)
		if j < 0 {
			break
		}
		start, end := d.pos(i+j), d.pos(i+j+len(old))
		// The line break that ends the line of start, or the last one.
		nl := lastNL
		if start <= lastNL {
			if after < start {
				after = start + strings.IndexByte(d.text[start:], '\n')
			}
			nl = after
		}
		b.WriteString(d.text[prev:start])
		if nl > 0 && d.text[nl-1] == '\r' {
			b.WriteString(crlfNew)
		} else {
			b.WriteString(new)
		}
		prev, i = end, i+j+len(old)
		if !all {
			break
		}
	}
	b.WriteString(d.text[prev:])
	return b.String()
}
