package safefs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
)

// maxLinkHops bounds how many symbolic links RealPath follows, like the
// kernel's limit.
const maxLinkHops = 40

// RealPath returns the file that path, an absolute clean path, names once
// every symbolic link in it is followed the way the kernel follows them
// (".." in a link's destination applies to the directory the link leads
// to). When a component does not exist, the rest of the path is appended
// as it is: a file that does not exist yet is placed under its nearest
// existing parent, and a link whose destination does not exist leads to
// that destination, the file a write creates.
//
// The answer may be stale by the time it is used; the tools open it with
// OpenDir, which refuses a path that has changed under it.
func RealPath(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("%s is not an absolute path", path)
	}
	if runtime.GOOS == "windows" {
		resolved, err := winRealPath(filepath.Clean(path), readWinLink)
		if err != nil {
			return "", err
		}
		return EvalExisting(resolved)
	}
	return walkPath(filepath.Clean(path), false)
}

// readWinLink is the winLinkReader of the running system: a symbolic link
// (ModeSymlink) or junction (which Go reports as irregular) whose
// destination os.Readlink can read. Another reparse point (a file a
// cloud-sync filter serves) is not a link; an unreadable one is left to
// the file layer, which refuses to go through it.
func readWinLink(p string) (string, bool, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return "", false, err
	}
	m := fi.Mode()
	if m&(fs.ModeSymlink|fs.ModeIrregular) == 0 {
		return "", false, nil
	}
	dest, err := os.Readlink(p)
	switch {
	case err == nil:
		return dest, true, nil
	case m&fs.ModeSymlink != 0:
		return "", false, err
	}
	return "", false, nil
}

// EvalExisting normalises the longest part of path that exists, a path
// without links, to the names its directories hold (filepath.EvalSymlinks
// gives each name its case on disk, and a short 8.3 name its long name)
// and appends the rest as it is: on Windows the path rules must judge the
// names the files have, since Windows opens C:\PROGRA~1 and
// c:\program files as C:\Program Files.
func EvalExisting(path string) (string, error) {
	rest := ""
	for p := path; ; {
		real, err := filepath.EvalSymlinks(p)
		if err == nil {
			return filepath.Join(real, rest), nil
		}
		parent := filepath.Dir(p)
		if !errors.Is(err, fs.ErrNotExist) || parent == p {
			return "", err
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}

// ShellPath returns the file a shell opens when a redirection names path,
// an absolute path exactly as the shell has it. Unlike RealPath it does
// not clean path first: it walks it component by component as the
// kernel does, so ".." after a symbolic link to a directory leads to the
// parent of the link's destination, not back to where the link is. Where
// the kernel's walk would fail, so does this one: a component that is not
// a directory with more of the path after it. A missing component is
// placed as RealPath places it (a file the redirection creates, or the
// destination of a dangling link), except that ".." after it is refused:
// what it leads to depends on what the line creates there. Links on
// procfs (/proc/self, /proc/PID/cwd, /proc/PID/root, /dev/fd/N, ...) are
// refused: they name files of the process that opens them, which is the
// shell, not the agent.
func ShellPath(path string) (string, error) {
	if !strings.HasPrefix(path, "/") {
		return "", fmt.Errorf("%s is not an absolute path", path)
	}
	return walkPath(path, true)
}

// walkPath resolves path, an absolute path, one component at a time; see
// RealPath and ShellPath (shell).
func walkPath(path string, shell bool) (string, error) {
	resolved, rest := "/", strings.TrimLeft(path, "/")
	hops := 0
	for rest != "" {
		var name string
		var more bool
		name, rest, more = strings.Cut(rest, "/")
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
			if shell && slices.Contains(strings.Split(rest, "/"), "..") {
				return "", fmt.Errorf("it goes through %s, which does not exist, and then \"..\": where that leads depends on what the command line creates there; create the directory first, or write the path without \"..\"", next)
			}
			return filepath.Join(next, rest), nil
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink == 0:
			if shell && more && !fi.IsDir() {
				return "", &fs.PathError{Op: "resolve", Path: next, Err: syscall.ENOTDIR}
			}
			resolved = next
			continue
		}
		if shell && onProcFS(resolved) {
			return "", fmt.Errorf("it goes through %s, a link of /proc that names a file of the process that opens it (the shell, not the agent), so the path rules cannot follow it", next)
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
