//go:build !linux

package agent

// onProcFS reports whether dir, a directory without links in its path, is
// where systems other than Linux keep per-process names: /proc, or the
// descriptor directory /dev/fd.
func onProcFS(dir string) bool {
	return within(dir, "/proc") || within(dir, "/dev/fd")
}

// selfRSS returns the process's resident memory in bytes: unknown (0)
// here.
func selfRSS() int64 { return 0 }
