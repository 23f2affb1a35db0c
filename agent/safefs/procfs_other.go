//go:build !linux

package safefs

import (
	"path/filepath"
	"strings"
)

// onProcFS reports whether dir, a directory without links in its path, is
// where systems other than Linux keep per-process names: /proc, or the
// descriptor directory /dev/fd.
func onProcFS(dir string) bool {
	// macOS compares names without case.
	d := strings.ToLower(dir)
	for _, p := range []string{"/proc", "/dev/fd"} {
		if d == p || strings.HasPrefix(d, p+string(filepath.Separator)) {
			return true
		}
	}
	return false
}
