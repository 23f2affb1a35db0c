package safefs

import (
	"strings"

	"golang.org/x/sys/unix"
)

// onProcFS reports whether dir, a directory without links in its path, is
// on a proc file system, wherever it is mounted.
func onProcFS(dir string) bool {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return dir == "/proc" || strings.HasPrefix(dir, "/proc/")
	}
	return st.Type == unix.PROC_SUPER_MAGIC
}
