package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// move renames a file, symbolic link (the link itself) or directory. It
// never replaces an existing destination, and never copies: source and
// destination must be on one file system. A directory moves only when the
// host policy lets the tools read and write every entry below it, and
// write each of them at its new place.
func (t *toolbox) move(ctx context.Context, tc *toolCall) *protocol.Result {
	var a protocol.MoveArgs
	if r := decodeArgs(tc, protocol.ToolMove, &a); r != nil {
		return r
	}
	switch {
	case a.Path == "":
		return toolFailure(tc, "path is empty; give the file or directory to move")
	case a.Destination == "":
		return toolFailure(tc, "destination is empty; give the new path, including the name")
	}
	want, r := expectedHash(tc, a.ExpectedSHA256)
	if r != nil {
		return r
	}
	path, target, r := t.checkedLink(tc, a.Path, policy.Read, policy.Write)
	if r != nil {
		return r
	}
	dest, destTarget, r := t.checkedLink(tc, a.Destination, policy.Write)
	if r != nil {
		return r
	}
	switch {
	case samePath(target, destTarget) && path != dest && samePath(path, dest):
		return toolFailure(tc, "destination %s names the same file as path %s: this host compares names without case; nothing was moved. To change only the case of a name, move it to another name first, then to the new one", dest, path)
	case samePath(target, destTarget):
		return toolFailure(tc, "destination %s is the same as path %s; nothing to move", dest, path)
	}
	unlock, err := t.lockFiles(target, destTarget)
	if err != nil {
		return toolFailure(tc, "%v; nothing was moved", err)
	}
	defer unlock()

	src, meta, err := entryMeta(target)
	if err != nil {
		return toolFailure(tc, "%s", safefs.Problem(path, err))
	}
	defer src.Close()
	isDir := meta.Mode.IsDir()
	switch {
	case meta.Mode.IsRegular():
		if r := t.checkExpected(ctx, tc, path, target, want); r != nil {
			return r
		}
	case want != "":
		return toolFailure(tc, "%s is a %s; expected_sha256 applies to regular files only. Leave it out to move it", path, typeName(meta.Mode))
	case isDir:
		if r := t.checkMoveTree(ctx, tc, path, target, dest, destTarget, src, meta); r != nil {
			return r
		}
	}
	if r := checkDestination(tc, path, dest, destTarget, meta); r != nil {
		return r
	}
	dst, err := safefs.OpenDir(filepath.Dir(destTarget), true)
	if err != nil {
		return toolFailure(tc, "create directory %s: %s", filepath.Dir(dest), safefs.Problem(filepath.Dir(dest), err))
	}
	defer dst.Close()
	err = src.MoveTo(filepath.Base(target), dst, filepath.Base(destTarget), isDir)
	switch {
	case errors.Is(err, fs.ErrExist):
		return destExists(tc, path, dest)
	case errors.Is(err, syscall.EXDEV):
		return crossDevice(tc, path, dest)
	case err != nil:
		return toolFailure(tc, "move %s to %s: %s; nothing was moved", path, dest, safefs.Problem(path, errors.Unwrap(err)))
	}
	src.Sync()
	dst.Sync()
	kind := typeName(meta.Mode)
	r = toolText(tc, fmt.Sprintf("Moved %s %s to %s", kind, path, dest))
	r.Structured, _ = json.Marshal(map[string]any{"path": path, "destination": dest, "type": kind})
	return r
}

// checkMoveTree checks a directory move: the tree must not hold the
// agent's own files or working directory, must not move into itself, and
// every entry below it must be readable and writable where it is and
// writable where it goes.
func (t *toolbox) checkMoveTree(ctx context.Context, tc *toolCall, path, target, dest, destTarget string, src *safefs.Dir, meta *safefs.Meta) *protocol.Result {
	if within(destTarget, target) || within(dest, path) {
		return toolFailure(tc, "cannot move directory %s into itself (%s); nothing was moved", path, dest)
	}
	if r := t.refuseTree(tc, "move", path, target); r != nil {
		return r
	}
	top, err := src.Sub(filepath.Base(target))
	if err != nil {
		return toolFailure(tc, "%s", safefs.Problem(path, err))
	}
	defer top.Close()
	w := &treeWalk{ctx: ctx, top: path, dev: meta.Dev, check: func(rel string, _ *safefs.Meta) error {
		if err := t.guard.checkResolved(under(path, rel), under(target, rel), policy.Read, policy.Write); err != nil {
			return err
		}
		return t.guard.checkResolved(under(dest, rel), under(destTarget, rel), policy.Write)
	}}
	if err := w.visit(top, "", 0); err != nil {
		return treeFailure(tc, path, err, "nothing was moved")
	}
	return nil
}

// checkDestination refuses a destination that exists, or that lies on
// another file system than the source, before any missing parent
// directory of it is created. The rename itself checks both again.
func checkDestination(tc *toolCall, path, dest, destTarget string, meta *safefs.Meta) *protocol.Result {
	if _, err := os.Lstat(destTarget); err == nil {
		return destExists(tc, path, dest)
	}
	for p := filepath.Dir(destTarget); ; p = filepath.Dir(p) {
		dev, ok := safefs.DeviceOf(p)
		switch {
		case !ok && isRoot(p):
			return nil
		case !ok:
			continue
		case dev != meta.Dev:
			return crossDevice(tc, path, dest)
		}
		return nil
	}
}

func destExists(tc *toolCall, path, dest string) *protocol.Result {
	return toolFailure(tc, "destination %s already exists; move never replaces anything, and nothing was moved. Delete it first, or choose another destination (the full new path, not a directory to move into)", dest)
}

func crossDevice(tc *toolCall, path, dest string) *protocol.Result {
	return toolFailure(tc, "%s and %s are on different file systems, and move only renames; nothing was moved. Copy a file with read and write, then delete the original", path, dest)
}
