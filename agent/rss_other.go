//go:build !linux && !darwin && !windows

package agent

// selfRSS returns the process's resident memory in bytes: unknown (0)
// here.
func selfRSS() int64 { return 0 }
