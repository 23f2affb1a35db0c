package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// maxLinkHops bounds how many symbolic links realPath follows, like the
// kernel's limit.
const maxLinkHops = 40

// realPath returns the file that path, an absolute clean path, names once
// every symbolic link in it is followed the way the kernel follows them
// (".." in a link's destination applies to the directory the link leads
// to). When a component does not exist, the rest of the path is appended
// as it is: a file that does not exist yet is placed under its nearest
// existing parent, and a link whose destination does not exist leads to
// that destination, the file a write creates.
//
// The answer may be stale by the time it is used; the tools open it with
// openDir, which refuses a path that has changed under it.
func realPath(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%s is not an absolute path", path)
	}
	resolved, rest := "/", strings.TrimPrefix(filepath.Clean(path), "/")
	hops := 0
	for rest != "" {
		var name string
		name, rest, _ = strings.Cut(rest, "/")
		switch name {
		case "", ".":
			continue
		case "..":
			resolved = filepath.Dir(resolved)
			continue
		}
		next := filepath.Join(resolved, name)
		fi, err := os.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return filepath.Join(next, rest), nil
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink == 0:
			resolved = next
			continue
		}
		if hops++; hops > maxLinkHops {
			return "", &fs.PathError{Op: "resolve", Path: path, Err: syscall.ELOOP}
		}
		dest, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(dest) {
			resolved = "/"
		}
		rest = strings.TrimSuffix(dest+"/"+rest, "/")
	}
	return resolved, nil
}
