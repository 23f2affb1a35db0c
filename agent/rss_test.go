package agent

import (
	"runtime"
	"testing"
)

// TestSelfRSS: the agent reports its resident memory on the systems it
// knows how to ask (Linux: /proc/self/statm; macOS: getrusage's peak;
// Windows: the working set), and a number a process of its kind can
// have.
func TestSelfRSS(t *testing.T) {
	switch runtime.GOOS {
	case "linux", "darwin", "windows":
	default:
		t.Skipf("no resident memory on %s", runtime.GOOS)
	}
	// Touch some memory, so that it is resident whatever the system
	// counts.
	buf := make([]byte, 8<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	rss := selfRSS()
	if rss < 8<<20 || rss > 4<<30 {
		t.Fatalf("selfRSS() = %d bytes; want at least the 8 MiB just touched, less than 4 GiB", rss)
	}
	runtime.KeepAlive(buf)
}
