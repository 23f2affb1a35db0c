package agent

import "golang.org/x/sys/unix"

// selfRSS returns the process's peak resident memory in bytes (0:
// unknown): getrusage's ru_maxrss, which macOS gives in bytes. The
// current resident size is only in the Mach task info, which Go reaches
// through cgo alone, and the agent is built without cgo.
func selfRSS() int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil || ru.Maxrss < 0 {
		return 0
	}
	return ru.Maxrss
}
