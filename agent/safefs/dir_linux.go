package safefs

import (
	"errors"

	"golang.org/x/sys/unix"
)

// dirFlags open a directory for walking: O_PATH needs only search
// permission, like the kernel's own path walk.
const dirFlags = unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC

// openDirFast opens the directory at path in one openat2 call that refuses
// every symbolic link on the way, as the component walk does. It reports
// false when the kernel lacks openat2 (or a sandbox forbids it) or the
// open fails for any reason: the walk then runs and reports precisely.
func openDirFast(path string) (int, bool) {
	fd, err := retry(func() (int, error) {
		return unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
			Flags:   uint64(dirFlags),
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
	})
	return fd, err == nil
}

// renameNoReplace renames oldName in oldfd to newName in newfd, failing
// with EEXIST when newName exists: renameat2 with RENAME_NOREPLACE, or
// renameChecked on file systems that do not support it.
func renameNoReplace(oldfd int, oldName string, newfd int, newName string, isDir bool) error {
	err := unix.Renameat2(oldfd, oldName, newfd, newName, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
		return renameChecked(oldfd, oldName, newfd, newName, isDir)
	}
	return err
}
