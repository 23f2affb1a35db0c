package load

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/integration"
)

// maxIdleRSS is the agent's memory budget when idle.
const maxIdleRSS = 20 << 20

// TestAgentIdleRSS: a joined, idle fleet-agent process stays within its
// memory budget, after it has served a few calls.
func TestAgentIdleRSS(t *testing.T) {
	env := integration.NewEnv(t, integration.Options{Agents: []string{}})
	env.StartAgentProcess("lean")
	env.WaitHost("lean", true)
	cs := env.Client("2025-11-25", nil)
	for i := range 20 {
		integration.MustOK(t, integration.Call(t, cs, "bash", map[string]any{"host": "lean", "command": fmt.Sprintf("echo %d", i)}))
	}
	time.Sleep(2 * time.Second) // a few heartbeats
	rss, err := vmRSS(env.AgentPID("lean"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("idle agent RSS: %.1f MiB", float64(rss)/(1<<20))
	if rss > maxIdleRSS {
		t.Fatalf("idle agent RSS %.1f MiB exceeds %d MiB", float64(rss)/(1<<20), maxIdleRSS>>20)
	}
}

func vmRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
