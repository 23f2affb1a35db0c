package agent

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// editArgs are the arguments of the edit tool.
type editArgs struct {
	hostArg
	Path  string     `json:"path"`
	Edits []editSpec `json:"edits"`
}

// editSpec is one replacement of an edit call.
type editSpec struct {
	OldString  string `json:"old_string"`
	NewString  string `json:"new_string"`
	ReplaceAll bool   `json:"replace_all"`
}

// edit applies exact-text replacements to a file: all of them or none.
func (t *toolbox) edit(ctx context.Context, tc *toolCall) *protocol.Result {
	var a editArgs
	if r := decodeArgs(tc, "edit", &a); r != nil {
		return r
	}
	switch {
	case a.Path == "":
		return toolFailure(tc, "path is empty; give the file to edit")
	case len(a.Edits) == 0:
		return toolFailure(tc, "edits is empty; give at least one {old_string, new_string}")
	}
	path, target, r := t.checkedPath(tc, a.Path, policy.Read, policy.Write)
	if r != nil {
		return r
	}
	unlock := t.lockFile(target)
	defer unlock()

	content, err := t.loadText(path, target)
	if err != nil {
		return textFailure(tc, err)
	}
	edited, n, err := applyEdits(content, path, a.Edits)
	if err != nil {
		return toolFailure(tc, "%v", err)
	}
	if err := writeFileAtomic(target, []byte(edited)); err != nil {
		return toolFailure(tc, "%v", err)
	}
	return toolText(tc, fmt.Sprintf("Successfully applied %d edit(s) to %s (%d replacement(s))", len(a.Edits), path, n))
}

// loadText returns the content of the text file at target, the resolved
// path of path.
func (t *toolbox) loadText(path, target string) (string, error) {
	f, br, err := t.openText(path, target, "edit works on text files only")
	if err != nil {
		return "", err
	}
	defer f.Close()
	data, err := io.ReadAll(br)
	if err != nil {
		return "", problem(fsProblem(path, err))
	}
	return string(data), nil
}

// applyEdits applies edits to content in order, each to the result of the
// ones before, and returns the edited content and the number of
// replacements made. Each old_string must occur exactly once unless its
// edit sets replace_all. The error names the first edit that fails and,
// for a mismatch, path.
func applyEdits(content, path string, edits []editSpec) (string, int, error) {
	total := 0
	for i, e := range edits {
		which := fmt.Sprintf("edit %d of %d", i+1, len(edits))
		if e.OldString == "" {
			return "", 0, fmt.Errorf("%s: old_string is empty; give the exact text to replace", which)
		}
		if e.NewString == e.OldString {
			return "", 0, fmt.Errorf("%s: new_string equals old_string, so the edit makes no change", which)
		}
		n := strings.Count(content, e.OldString)
		switch {
		case n == 0:
			return "", 0, fmt.Errorf("%s: old_string not found in %s", which, path)
		case n > 1 && !e.ReplaceAll:
			return "", 0, fmt.Errorf("%s: old_string matches %d times in %s; add surrounding context to make it unique, or set replace_all", which, n, path)
		case e.ReplaceAll:
			content = strings.ReplaceAll(content, e.OldString, e.NewString)
		default:
			content = strings.Replace(content, e.OldString, e.NewString, 1)
		}
		total += n
	}
	return content, total, nil
}
