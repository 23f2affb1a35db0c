//go:build !unix

package protocol

import (
	"testing"
	"time"
)

func cpuTime() time.Duration { return 0 }

// reportCPU reports nothing where the process's CPU time is not at hand.
func reportCPU(*testing.B, time.Duration) {}
