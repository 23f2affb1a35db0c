//go:build unix

package safefs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// The file tools check a resolved path, then open exactly that path: from
// the root, one component at a time, refusing symbolic links (O_NOFOLLOW
// on every step). A link swapped in after the check therefore cannot
// redirect a read or a write: the open fails instead. Writes create their
// temporary file and rename it relative to the directory opened this way.

// Dir is an open directory reached without following links.
type Dir struct {
	fd int
	// Path is the directory's path, as it was opened.
	Path string
}

// OpenDir opens the directory at path, an absolute clean path that had no
// symbolic links when it was checked. With create, missing directories
// are made (mode 0755, less the umask).
func OpenDir(path string, create bool) (*Dir, error) {
	if fd, ok := openDirFast(path); ok {
		return &Dir{fd: fd, Path: path}, nil
	}
	fd, err := retry(func() (int, error) { return unix.Open("/", dirFlags, 0) })
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: "/", Err: err}
	}
	cur := "/"
	for _, name := range strings.Split(strings.TrimPrefix(path, "/"), "/") {
		if name == "" {
			continue
		}
		next, err := openComponent(fd, name, create)
		unix.Close(fd)
		cur = filepath.Join(cur, name)
		if err != nil {
			return nil, &fs.PathError{Op: "open", Path: cur, Err: err}
		}
		fd = next
	}
	return &Dir{fd: fd, Path: path}, nil
}

// openComponent opens directory name in dirfd, without following a link.
func openComponent(dirfd int, name string, create bool) (int, error) {
	for {
		fd, err := retry(func() (int, error) { return unix.Openat(dirfd, name, dirFlags|unix.O_NOFOLLOW, 0) })
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.ENOENT) && create:
			if err := unix.Mkdirat(dirfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, err
			}
			create = false
		case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
			if isLinkAt(dirfd, name) {
				return -1, ErrSwapped
			}
			return -1, unix.ENOTDIR
		default:
			return -1, err
		}
	}
}

func isLinkAt(dirfd int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// retry runs f again while it is interrupted by a signal.
func retry(f func() (int, error)) (int, error) {
	for {
		fd, err := f()
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

// Close closes the directory.
func (d *Dir) Close() error { return unix.Close(d.fd) }

// OpenRead opens name in d for reading, without following a link, and
// without waiting should it be a pipe or claiming it should it be a
// terminal.
func (d *Dir) OpenRead(name string) (*os.File, error) {
	return d.open(name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
}

func (d *Dir) open(name string, flag int, perm uint32) (*os.File, error) {
	p := filepath.Join(d.Path, name)
	fd, err := retry(func() (int, error) { return unix.Openat(d.fd, name, flag|unix.O_NOFOLLOW|unix.O_CLOEXEC, perm) })
	if errors.Is(err, unix.ELOOP) && isLinkAt(d.fd, name) {
		err = ErrSwapped
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return os.NewFile(uintptr(fd), p), nil
}

// Lstat describes name in d without following a link.
func (d *Dir) Lstat(name string) (*Meta, error) {
	var st unix.Stat_t
	_, err := retry(func() (int, error) { return 0, unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) })
	if err != nil {
		return nil, &fs.PathError{Op: "lstat", Path: filepath.Join(d.Path, name), Err: err}
	}
	return &Meta{Mode: fileMode(uint32(st.Mode)), UID: int(st.Uid), GID: int(st.Gid), Size: st.Size, Dev: uint64(st.Dev), Name: name}, nil // the types differ by system
}

func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		mode |= fs.ModeDir
	case unix.S_IFLNK:
		mode |= fs.ModeSymlink
	case unix.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case unix.S_IFSOCK:
		mode |= fs.ModeSocket
	case unix.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&unix.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// Replace writes data to a new temporary file in d and renames it over
// name, so that readers see either the old content or the new. The
// temporary file gets old's mode and owner (0644 when old is nil); on
// failure it is removed and name is left alone.
func (d *Dir) Replace(name string, data []byte, old *Meta) error {
	tmpName, err := d.Stage(name, data, old)
	if err != nil {
		return err
	}
	if err := unix.Renameat(d.fd, tmpName, d.fd, name); err != nil {
		_ = unix.Unlinkat(d.fd, tmpName, 0)
		return fmt.Errorf("replace %s: %w", filepath.Join(d.Path, name), err)
	}
	d.Sync()
	return nil
}

// Stage writes data to a new temporary file next to name, with old's
// mode and owner (0644 when old is nil), synced, and returns its name.
// On failure nothing is left behind.
func (d *Dir) Stage(name string, data []byte, old *Meta) (string, error) {
	tmp, tmpName, err := d.createTemp(name)
	if err != nil {
		return "", fmt.Errorf("create a temporary file in %s: %s", d.Path, Problem(d.Path, err))
	}
	if err := fillTemp(tmp, data, old); err != nil {
		tmp.Close()
		_ = unix.Unlinkat(d.fd, tmpName, 0)
		return "", fmt.Errorf("write %s: %w", filepath.Join(d.Path, name), err)
	}
	return tmpName, nil
}

// StageAs writes data to a new file called tmpName in d, as stage does,
// failing with fs.ErrExist when the name is taken. On failure nothing is
// left behind.
func (d *Dir) StageAs(tmpName string, data []byte, old *Meta) error {
	tmp, err := d.open(tmpName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := fillTemp(tmp, data, old); err != nil {
		tmp.Close()
		_ = unix.Unlinkat(d.fd, tmpName, 0)
		return fmt.Errorf("write %s: %w", filepath.Join(d.Path, tmpName), err)
	}
	return nil
}

// Link gives the file name in d the second name to, failing when to
// exists. NoHardLinks tells a file system without hard links.
func (d *Dir) Link(name, to string) error {
	if err := unix.Linkat(d.fd, name, d.fd, to, 0); err != nil {
		return &fs.PathError{Op: "link", Path: filepath.Join(d.Path, to), Err: err}
	}
	return nil
}

// RenameNew renames from to to within d without replacing anything: it
// fails with an error matching fs.ErrExist when to exists.
func (d *Dir) RenameNew(from, to string) error {
	return d.MoveTo(from, d, to, false)
}

// Rename renames from to to within d, replacing to.
func (d *Dir) Rename(from, to string) error {
	if err := unix.Renameat(d.fd, from, d.fd, to); err != nil {
		return &fs.PathError{Op: "rename", Path: filepath.Join(d.Path, to), Err: err}
	}
	return nil
}

// LinkNew gives the file from the new name to in d, failing with
// fs.ErrExist when to exists, and removes the name from: it renames
// without replacing. Where the file system has no hard links it checks
// that to is free and renames.
func (d *Dir) LinkNew(from, to string) error {
	err := unix.Linkat(d.fd, from, d.fd, to, 0)
	switch {
	case err == nil:
		_ = unix.Unlinkat(d.fd, from, 0)
		return nil
	case errors.Is(err, unix.EEXIST):
		return &fs.PathError{Op: "create", Path: filepath.Join(d.Path, to), Err: fs.ErrExist}
	case !NoHardLinks(err):
		return &fs.PathError{Op: "link", Path: filepath.Join(d.Path, to), Err: err}
	}
	if _, err := d.Lstat(to); err == nil {
		return &fs.PathError{Op: "create", Path: filepath.Join(d.Path, to), Err: fs.ErrExist}
	}
	return d.Rename(from, to)
}

// NoHardLinks reports whether a link failed because the file system
// does not do hard links.
func NoHardLinks(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) ||
		errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EMLINK) || errors.Is(err, unix.ENOSYS)
}

// createTemp creates a new hidden file next to name, readable by the
// agent only until fillTemp gives it its mode.
func (d *Dir) createTemp(name string) (*os.File, string, error) {
	for range 100 {
		tmpName := tempName(name)
		f, err := d.open(tmpName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
		if !errors.Is(err, fs.ErrExist) {
			return f, tmpName, err
		}
	}
	return nil, "", errors.New("no free temporary file name")
}

// Sync makes a rename in d durable. Errors are ignored: some file systems
// cannot sync directories, and the rename itself has succeeded.
func (d *Dir) Sync() {
	fd, err := retry(func() (int, error) {
		return unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return
	}
	_ = unix.Fsync(fd)
	unix.Close(fd)
}

// Sub opens directory name in d without following a link.
func (d *Dir) Sub(name string) (*Dir, error) {
	p := filepath.Join(d.Path, name)
	fd, err := openComponent(d.fd, name, false)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: p, Err: err}
	}
	return &Dir{fd: fd, Path: p}, nil
}

// ReadNames returns the names in d ("." and ".." left out), in the order
// the file system keeps them, at most max of them, and whether more
// remain.
func (d *Dir) ReadNames(max int) ([]string, bool, error) {
	fd, err := retry(func() (int, error) {
		return unix.Openat(d.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	})
	if err != nil {
		return nil, false, &fs.PathError{Op: "open", Path: d.Path, Err: err}
	}
	f := os.NewFile(uintptr(fd), d.Path)
	defer f.Close()
	var names []string
	for len(names) <= max {
		batch, err := f.Readdirnames(min(1024, max+1-len(names)))
		names = append(names, batch...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, false, err
		}
	}
	if len(names) > max {
		return names[:max], true, nil
	}
	return names, false, nil
}

// Readlink returns the destination of the symbolic link name in d.
func (d *Dir) Readlink(name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(d.fd, name, buf)
		if err != nil {
			return "", &fs.PathError{Op: "readlink", Path: filepath.Join(d.Path, name), Err: err}
		}
		if n < size || size >= 1<<16 {
			return string(buf[:n]), nil
		}
	}
}

// Remove deletes the entry name from d: the link itself for a symbolic
// link, and with dir an empty directory.
func (d *Dir) Remove(name string, dir bool) error {
	flags := 0
	if dir {
		flags = unix.AT_REMOVEDIR
	}
	if _, err := retry(func() (int, error) { return 0, unix.Unlinkat(d.fd, name, flags) }); err != nil {
		return &fs.PathError{Op: "remove", Path: filepath.Join(d.Path, name), Err: err}
	}
	return nil
}

// MoveTo renames name in d to toName in to, never replacing an entry
// that exists there: it then fails with an error that matches
// fs.ErrExist. isDir says whether name is a directory.
func (d *Dir) MoveTo(name string, to *Dir, toName string, isDir bool) error {
	if err := renameNoReplace(d.fd, name, to.fd, toName, isDir); err != nil {
		return &os.LinkError{Op: "move", Old: filepath.Join(d.Path, name), New: filepath.Join(to.Path, toName), Err: err}
	}
	return nil
}

// renameChecked renames without replacing where the kernel offers no
// such rename: a file is linked under the new name (which fails if the
// name exists) and then unlinked under the old; a directory, which
// cannot be linked, is renamed after checking that the new name is free,
// which leaves a short window in which an entry created there would be
// replaced.
func renameChecked(oldfd int, oldName string, newfd int, newName string, isDir bool) error {
	if !isDir {
		err := unix.Linkat(oldfd, oldName, newfd, newName, 0)
		switch {
		case err == nil:
			if err := unix.Unlinkat(oldfd, oldName, 0); err != nil {
				_ = unix.Unlinkat(newfd, newName, 0)
				return err
			}
			return nil
		case errors.Is(err, unix.EEXIST), errors.Is(err, unix.EXDEV), errors.Is(err, unix.ENOENT):
			return err
		}
		// The file system has no hard links (or refuses this one): fall
		// back to the checked rename.
	}
	var st unix.Stat_t
	err := unix.Fstatat(newfd, newName, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case err == nil:
		return unix.EEXIST
	case !errors.Is(err, unix.ENOENT):
		return err
	}
	return unix.Renameat(oldfd, oldName, newfd, newName)
}

// DeviceOf returns the file system of the file at path (links
// followed), as lstat reports it in Meta.Dev.
func DeviceOf(path string) (uint64, bool) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, false
	}
	return uint64(st.Dev), true // the type differs by system
}

// OpenedRegular reports whether fi, the description of a file the layer
// opened, is a regular file.
func OpenedRegular(fi fs.FileInfo) bool { return fi.Mode().IsRegular() }

// RealName returns the name, as the directory holds it, of the entry
// name in dir: on Unix the name itself.
func RealName(dir, name string) (string, error) { return name, nil }

// flockDir takes an exclusive flock on the directory dir and returns the
// function that releases it (closing the descriptor that holds it). It
// polls, so that a process that holds the lock for good cannot make it
// wait for ever: after wait it gives up with ErrDirLocked.
func flockDir(dir string, wait time.Duration) (func(), error) {
	fd, err := retry(func() (int, error) {
		return unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	})
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		_, err := retry(func() (int, error) { return 0, unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) })
		if err == nil {
			return func() { unix.Close(fd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			unix.Close(fd)
			if errors.Is(err, unix.EWOULDBLOCK) {
				err = ErrDirLocked
			}
			return nil, err
		}
		time.Sleep(pause)
	}
}

// NoFollow makes an open fail on a symbolic link.
const NoFollow = unix.O_NOFOLLOW

// LockNB takes an exclusive flock on f without waiting. It reports false
// when another open file holds one (err is then nil) or on failure.
func LockNB(f *os.File) (bool, error) {
	_, err := retry(func() (int, error) { return 0, unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) })
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		return false, nil
	}
	return false, err
}

// LinkKind names what the layer refuses to go through, for messages.
const LinkKind = "a symbolic link"
