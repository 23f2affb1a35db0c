package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestNoGoroutineLeak drives a mix of calls — successes, tool errors,
// timeouts, cancellations, unknown hosts — through both MCP eras, closes
// the clients, and checks that the gateway and agents return to the number
// of goroutines they started with.
func TestNoGoroutineLeak(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha", "beta"}})
	settle := func() int {
		// Idle keep-alive connections of the clients' shared transport
		// hold goroutines on both ends; they are the client's, not ours.
		http.DefaultTransport.(*http.Transport).CloseIdleConnections()
		time.Sleep(200 * time.Millisecond)
		return runtime.NumGoroutine()
	}
	base := settle()

	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			cs := env.Client(eras[i%2].Version, nil)
			defer cs.Close()
			host := []string{"alpha", "beta"}[i%2]
			for j := range 10 {
				args := map[string]any{"host": host, "command": fmt.Sprintf("echo %d-%d", i, j)}
				ctx, cancel := context.WithCancel(context.Background())
				switch j % 5 {
				case 1:
					args["command"] = "exit 3"
				case 2:
					args["command"], args["timeout"] = "sleep 5.4321", 0.2
				case 3:
					args["command"] = "sleep 5.4321"
					time.AfterFunc(100*time.Millisecond, cancel)
				case 4:
					args["host"] = "nowhere"
				}
				_, _ = cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: args})
				cancel()
			}
		})
	}
	wg.Wait()

	deadline := time.Now().Add(10 * time.Second)
	n := settle()
	for n > base+2 && time.Now().Before(deadline) {
		n = settle()
	}
	if n > base+2 {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Fatalf("%d goroutines after the load, %d before: leaked?\n%s", n, base, buf)
	}
	t.Logf("goroutines: %d before, %d after", base, n)
	// Timed-out and cancelled commands were killed with their process
	// groups.
	if left := processesRunning("5.4321"); len(left) > 0 {
		t.Fatalf("processes left behind: %v", left)
	}
}

// processesRunning lists live processes whose command line contains marker.
func processesRunning(marker string) []string {
	var out []string
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		cmdline, err := os.ReadFile("/proc/" + d.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(cmdline), marker) {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + d.Name() + "/stat"); err == nil {
			if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue
			}
		}
		out = append(out, d.Name()+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
	}
	return out
}
