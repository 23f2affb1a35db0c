//go:build !unix

package main

// raiseFileLimit has nothing to raise where there is no RLIMIT_NOFILE.
func raiseFileLimit() error { return nil }

// cpuSeconds is not measured here.
func cpuSeconds() float64 { return 0 }
