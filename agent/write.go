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

// write creates or replaces a file with the given content. With
// expected_sha256 it replaces only that version of the file; with
// overwrite false it only creates. Both look at the file, so they need
// read permission too.
func (t *toolbox) write(ctx context.Context, tc *toolCall) *protocol.Result {
	var a protocol.WriteArgs
	if r := decodeArgs(tc, protocol.ToolWrite, &a); r != nil {
		return r
	}
	want, r := expectedHash(tc, a.ExpectedSHA256)
	if r != nil {
		return r
	}
	createOnly := a.Overwrite != nil && !*a.Overwrite
	ops := []policy.Op{policy.Write}
	switch {
	case createOnly && want != "":
		return toolFailure(tc, "overwrite false and expected_sha256 contradict each other: the first only creates a new file, the second only replaces an existing one; give one of them")
	case createOnly || want != "":
		ops = []policy.Op{policy.Read, policy.Write}
	}
	path, target, r := t.checkedPath(tc, a.Path, ops...)
	if r != nil {
		return r
	}
	unlock, err := t.lockFile(target)
	if err != nil {
		return toolFailure(tc, "%v; nothing was changed", err)
	}
	defer unlock()
	if createOnly {
		if r := t.refuseExisting(ctx, tc, path, target); r != nil {
			return r
		}
	} else if r := t.checkExpected(ctx, tc, path, target, want); r != nil {
		return r
	}
	data := []byte(a.Content)
	created, err := replaceFile(target, data)
	if err != nil {
		return toolFailure(tc, "%v", err)
	}
	res := toolText(tc, fmt.Sprintf("Successfully wrote %d bytes to %s", len(data), path))
	res.Structured, _ = json.Marshal(map[string]any{"path": path, "sha256": sha256Hex(data), "bytes": len(data), "created": created})
	return res
}

// refuseExisting is the failure of a write with overwrite false when
// something exists at target, the resolved path of path; nil when nothing
// does.
func (t *toolbox) refuseExisting(ctx context.Context, tc *toolCall, path, target string) *protocol.Result {
	_, err := os.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return nil // writing reports a parent that is not a directory
	case err != nil:
		return toolFailure(tc, "%s", safefs.Problem(path, err))
	}
	current, err := t.currentSHA256(ctx, target)
	if err != nil || current == "" {
		return toolFailure(tc, "%s already exists; nothing was written. Leave out overwrite (or set it to true) to replace it.", path)
	}
	r := toolFailure(tc, "%s already exists (sha256 %s); nothing was written. To replace it, write again with expected_sha256 %s instead of overwrite false.", path, current, current)
	r.Structured, _ = json.Marshal(map[string]any{"path": path, "exists": true, "current_sha256": current})
	return r
}

// writeFileAtomic is replaceFile for callers that need not know whether
// the file was created.
func writeFileAtomic(path string, data []byte) error {
	_, err := replaceFile(path, data)
	return err
}

// replaceFile replaces the regular file at path, a resolved path the
// guard allowed, with data, or creates it (mode 0644) with any missing
// parent directories (0755). Readers see either the old or the new
// content, never a mix: the data goes to a temporary file in the same
// directory that is synced, given the old file's mode and owner, and
// renamed over path. The directory is reached without following links,
// so a link swapped in after the check cannot redirect the write. On
// failure path is left untouched and the temporary file removed. created
// reports that no file was there before.
func replaceFile(path string, data []byte) (created bool, err error) {
	dir, name := filepath.Dir(path), filepath.Base(path)
	if isRoot(path) {
		return false, fmt.Errorf("%s is a directory; give the path of a file", path)
	}
	d, err := safefs.OpenDir(dir, true)
	if err != nil {
		return false, fmt.Errorf("create directory %s: %s", dir, safefs.Problem(dir, err))
	}
	defer d.Close()
	old, err := d.Lstat(name)
	switch {
	case err == nil && old.Mode.IsDir():
		return false, fmt.Errorf("%s is a directory; give the path of a file", path)
	case err == nil && old.Mode&fs.ModeSymlink != 0:
		return false, errors.New(safefs.Problem(path, safefs.ErrSwapped))
	case err == nil && !old.Mode.IsRegular():
		return false, fmt.Errorf("%s is not a regular file; only regular files can be written", path)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return false, errors.New(safefs.Problem(path, err))
	case err != nil:
		old = nil
	}
	return old == nil, d.Replace(name, data, old)
}

// isRoot reports whether p, an absolute clean path, is the root of its
// file system: "/", or on Windows a drive (C:\) or share (\\srv\share).
func isRoot(p string) bool { return filepath.Dir(p) == p }
