package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// writeArgs are the arguments of the write tool.
type writeArgs struct {
	hostArg
	Path    string `json:"path"`
	Content string `json:"content"`
}

// write creates or replaces a file with the given content.
func (t *toolbox) write(ctx context.Context, tc *toolCall) *protocol.Result {
	var a writeArgs
	if r := decodeArgs(tc, "write", &a); r != nil {
		return r
	}
	path, err := t.resolve(a.Path)
	if err != nil {
		return toolFailure(tc, "%v", err)
	}
	target, err := followLinks(path)
	if err != nil {
		return toolFailure(tc, "%s", fsProblem(path, err))
	}
	unlock := t.lockFile(target)
	defer unlock()
	if err := writeFileAtomic(target, []byte(a.Content)); err != nil {
		return toolFailure(tc, "%v", err)
	}
	return toolText(tc, fmt.Sprintf("Successfully wrote %d bytes to %s", len(a.Content), path))
}

// maxLinkHops bounds how many symbolic links followLinks follows, like the
// kernel's limit.
const maxLinkHops = 40

// followLinks returns the file that path names once symbolic links in its
// last element are followed, so that writing replaces the file a link
// points to rather than the link. A path that does not exist, or a link
// whose destination does not exist, yields the path a new file would get.
func followLinks(path string) (string, error) {
	for range maxLinkHops {
		fi, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return path, nil
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return path, nil
		}
		dest, err := os.Readlink(path)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(dest) {
			// Relative links are relative to the real directory.
			dir, err := filepath.EvalSymlinks(filepath.Dir(path))
			if err != nil {
				return "", err
			}
			dest = filepath.Join(dir, dest)
		}
		path = filepath.Clean(dest)
	}
	return "", &fs.PathError{Op: "follow links", Path: path, Err: syscall.ELOOP}
}

// writeFileAtomic replaces the regular file path with data, or creates it
// (mode 0644) with any missing parent directories (0755). Readers see
// either the old or the new content, never a mix: the data goes to a
// temporary file in the same directory that is synced, given the old
// file's mode and owner, and renamed over path. On failure path is left
// untouched and the temporary file removed.
func writeFileAtomic(path string, data []byte) error {
	old, err := os.Stat(path)
	switch {
	case err == nil && old.IsDir():
		return fmt.Errorf("%s is a directory; give the path of a file", path)
	case err == nil && !old.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file; only regular files can be written", path)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return errors.New(fsProblem(path, err))
	case err != nil:
		old = nil
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create directory %s: %s", dir, fsProblem(dir, err))
	}
	tmp, err := os.CreateTemp(dir, tempPattern(path))
	if err != nil {
		return fmt.Errorf("create a temporary file in %s: %s", dir, fsProblem(dir, err))
	}
	if err := fillTemp(tmp, data, old); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("replace %s: %w", path, err)
	}
	syncDir(dir)
	return nil
}

// tempPattern returns the os.CreateTemp pattern for a temporary file next
// to path: hidden, recognisable, and short enough for any file system.
func tempPattern(path string) string {
	base := filepath.Base(path)
	if len(base) > 100 {
		base = base[:100]
	}
	return "." + base + ".tmp-*"
}

// fillTemp writes data to tmp, gives it the owner and mode of old (0644
// when old is nil), syncs and closes it.
func fillTemp(tmp *os.File, data []byte, old fs.FileInfo) error {
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	mode := fs.FileMode(0o644)
	if old != nil {
		mode = old.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if st, ok := old.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid()) {
			// Keeping the owner only works with privileges; without them
			// the file gets the agent's owner, as any new file would.
			_ = tmp.Chown(int(st.Uid), int(st.Gid))
		}
	}
	// Chmod after Chown: chown clears the set-user-ID bit.
	if err := tmp.Chmod(mode); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	return tmp.Close()
}

// syncDir makes a rename in dir durable. Errors are ignored: some file
// systems cannot sync directories, and the rename itself has succeeded.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	d.Close()
}

// fsProblem describes a file-system error on path for a model.
func fsProblem(path string, err error) string {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return path + ": no such file"
	case errors.Is(err, fs.ErrPermission):
		return path + ": permission denied"
	case errors.Is(err, syscall.ENOTDIR):
		return path + ": a parent of it is not a directory"
	case errors.Is(err, syscall.ELOOP):
		return path + ": too many levels of symbolic links"
	}
	return err.Error()
}
