package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// delete removes one file or symbolic link (the link itself), or with
// recursive a directory and everything in it. A directory is deleted
// only when the host policy lets the tools write it and every entry
// below it: all of them are checked before anything is deleted.
func (t *toolbox) delete(ctx context.Context, tc *toolCall) *protocol.Result {
	var a protocol.DeleteArgs
	if r := decodeArgs(tc, protocol.ToolDelete, &a); r != nil {
		return r
	}
	if a.Path == "" {
		return toolFailure(tc, "path is empty; give the file or directory to delete")
	}
	want, r := expectedHash(tc, a.ExpectedSHA256)
	if r != nil {
		return r
	}
	path, target, r := t.checkedLink(tc, a.Path, policy.Write)
	if r != nil {
		return r
	}
	unlock, err := t.lockFile(target)
	if err != nil {
		return toolFailure(tc, "%v; nothing was changed", err)
	}
	defer unlock()

	d, meta, err := entryMeta(target)
	if err != nil {
		return toolFailure(tc, "%s", safefs.Problem(path, err))
	}
	defer d.Close()
	name := filepath.Base(target)
	switch {
	case meta.Mode.IsDir():
		return t.deleteDir(ctx, tc, a, path, target, d, meta)
	case meta.Mode.IsRegular():
		if r := t.checkExpected(ctx, tc, path, target, want); r != nil {
			return r
		}
	case meta.Mode&fs.ModeSymlink != 0 && want != "":
		return toolFailure(tc, "%s is a symbolic link; expected_sha256 applies to regular files only. Leave it out to delete the link", path)
	case meta.Mode&fs.ModeSymlink == 0:
		return toolFailure(tc, "%s is a %s; delete removes only files, symbolic links and directories. Use bash if you mean it", path, typeName(meta.Mode))
	}
	if err := d.Remove(name, false); err != nil {
		return toolFailure(tc, "%s", safefs.Problem(path, err))
	}
	d.Sync()
	kind := typeName(meta.Mode)
	return deleted(tc, path, kind, 0, fmt.Sprintf("Deleted %s %s", kind, path))
}

// deleteDir deletes the directory at path (resolved to target, an entry
// of d) and everything in it, after checking every entry.
func (t *toolbox) deleteDir(ctx context.Context, tc *toolCall, a protocol.DeleteArgs, path, target string, d *safefs.Dir, meta *safefs.Meta) *protocol.Result {
	switch {
	case !a.Recursive:
		return toolFailure(tc, "%s is a directory; set recursive: true to delete it and everything in it", path)
	case a.ExpectedSHA256 != "":
		return toolFailure(tc, "%s is a directory; expected_sha256 applies to files only. Leave it out to delete the directory", path)
	}
	if r := t.refuseTree(tc, "delete", path, target); r != nil {
		return r
	}
	name := filepath.Base(target)
	top, err := d.Sub(name)
	if err != nil {
		return toolFailure(tc, "%s", safefs.Problem(path, err))
	}
	defer top.Close()
	w := &treeWalk{ctx: ctx, top: path, dev: meta.Dev, check: func(rel string, _ *safefs.Meta) error {
		return t.guard.checkResolved(under(path, rel), under(target, rel), policy.Write)
	}}
	if err := w.visit(top, "", 0); err != nil {
		return treeFailure(tc, path, err, "nothing was deleted")
	}
	checked := w.entries
	w.entries = 0
	removed := 0
	err = w.removeAll(top, "", 0, &removed)
	if err == nil {
		err = d.Remove(name, true)
	}
	if err != nil {
		return treeFailure(tc, path, err, fmt.Sprintf("%d of the %d entries checked were deleted before it stopped; the rest of %s is still there", removed, checked, path))
	}
	d.Sync()
	return deleted(tc, path, "directory", removed, fmt.Sprintf("Deleted directory %s and the %d entries in it", path, removed))
}

// deleted is the result of a successful delete.
func deleted(tc *toolCall, path, kind string, entries int, text string) *protocol.Result {
	r := toolText(tc, text)
	r.Structured, _ = json.Marshal(map[string]any{"path": path, "type": kind, "entries_deleted": entries})
	return r
}
