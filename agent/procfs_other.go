//go:build !linux

package agent

// onProcFS reports whether dir, a directory without links in its path, is
// where systems other than Linux keep per-process names: /proc, or the
// descriptor directory /dev/fd.
func onProcFS(dir string) bool {
	return within(dir, "/proc") || within(dir, "/dev/fd")
}
