//go:build unix

package install

import (
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// chownTree gives dir and everything in it to uid:gid, not following
// symbolic links.
func chownTree(dir string, uid, gid int) error {
	return filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// dirWritable reports whether this process may make files in dir.
func dirWritable(dir string) bool { return unix.Access(dir, unix.W_OK|unix.X_OK) == nil }
