//go:build unix

package ha

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/integration"
)

// failoverTask starts a background task on a real agent of c (dialling
// every node) for TestClusterFailover: end makes it end, once the quorum
// is lost, and waits for it to end on its host; check reads it through
// every replica, whole.
func failoverTask(t *testing.T, c *gwCluster) (end, check func()) {
	const host = "task-ha"
	dir := startClusterAgent(t, c.gw(0), host, c.natsURLs())
	integration.KillTasksAfter(t, dir)
	for i := range c.cfgs {
		waitOnline(t, c.gw(i), []string{host})
	}
	id, _ := integration.StartBackground(t, clientTo(t, c.gw(0).MCPURL(), ""), host,
		"echo started; while [ ! -e gate ]; do sleep 0.05; done; echo ended", nil)
	end = func() {
		if err := os.WriteFile(filepath.Join(dir, "gate"), nil, 0o600); err != nil {
			t.Error(err)
		}
		integration.WaitFor(t, 30*time.Second, "the task to end on its host while the quorum is lost", func() bool {
			data, err := os.ReadFile(filepath.Join(dir, ".state", "tasks", id, "status.json"))
			return err == nil && strings.Contains(string(data), `"succeeded"`)
		})
	}
	check = func() {
		for i := range c.cfgs {
			st, res := integration.AwaitTask(t, clientTo(t, c.gw(i).MCPURL(), ""), host, id)
			if st["state"] != "succeeded" || st["output_tail"] != "started\nended\n" {
				t.Errorf("the background task, read through gateway %d after the faults: %s", i+1, integration.Text(res))
			}
		}
	}
	return end, check
}
