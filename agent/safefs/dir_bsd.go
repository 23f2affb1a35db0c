//go:build unix && !linux

package safefs

import "golang.org/x/sys/unix"

// dirFlags open a directory for walking.
const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC

// openDirFast is not available here: the component walk opens directories.
func openDirFast(string) (int, bool) { return -1, false }

// renameNoReplace renames oldName in oldfd to newName in newfd, failing
// with EEXIST when newName exists (see renameChecked).
func renameNoReplace(oldfd int, oldName string, newfd int, newName string, isDir bool) error {
	return renameChecked(oldfd, oldName, newfd, newName, isDir)
}
