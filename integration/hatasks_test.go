//go:build unix

package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestTasksThroughNodeAndQuorumLoss: a background task on a real agent
// lives through the loss of the NATS node its agent is connected to (the
// gateway on that node with it), and then through the loss of the
// cluster's quorum; its output is whole once it can be read again.
//
// The agent is given only the first victim's URL, as an operator who
// lists one node would: it learns the others from the cluster and
// reconnects to one of them. While the quorum is lost the last gateway
// refuses to read the task (it cannot record the call), and the task
// ends meanwhile; once a second gateway is back, both read its result.
func TestTasksThroughNodeAndQuorumLoss(t *testing.T) {
	c := startGatewayCluster(t, 3, nil)
	const host, victim, second, last = "task-ha", 1, 0, 2
	dir := startClusterAgent(t, c.gw(0), host, []string{"nats://" + c.cfgs[victim].NATSListen})
	killTasksAfter(t, dir)
	for i := range 3 {
		waitOnline(t, c.gw(i), []string{host})
	}
	script := "while [ ! -e gate-1 ]; do sleep 0.05; done; echo one; " +
		"while [ ! -e gate-2 ]; do sleep 0.05; done; echo two"
	id, output := startBackground(t, clientTo(t, c.gw(victim).MCPURL(), ""), host, script, nil)
	reader := clientTo(t, c.gw(last).MCPURL(), "")

	// The agent's node goes, with the gateway that started the task.
	at := time.Now()
	c.stop(victim)
	var st map[string]any
	waitFor(t, 30*time.Second, "the task read through another gateway after its agent's node stopped", func() bool {
		res, ok := tryCall(reader, "task_status", map[string]any{"host": host, "task_id": id, "wait": 0})
		if ok {
			st, _ = res.StructuredContent.(map[string]any)
		}
		return ok && st["state"] == "running"
	})
	t.Logf("node %d (the agent's) stopped: the running task was read through gateway %d after %s",
		victim+1, last+1, time.Since(at).Round(time.Millisecond))
	if err := os.WriteFile(filepath.Join(dir, "gate-1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the task's first line, read through the gateway", func() bool {
		res, ok := tryCall(reader, "read", map[string]any{"host": host, "path": output})
		return ok && strings.Contains(text(res), "one")
	})

	// A second node goes: the last one has no quorum. It refuses the
	// read, saying why, and the task ends meanwhile.
	c.stop(second)
	waitFor(t, 30*time.Second, "the last gateway to refuse calls it cannot record", func() bool {
		res, _ := tryCall(reader, "task_status", map[string]any{"host": host, "task_id": id, "wait": 0})
		return res != nil && res.IsError && strings.Contains(text(res), "cannot record it in the audit trail")
	})
	if err := os.WriteFile(filepath.Join(dir, "gate-2"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the task to end on its host while the quorum is lost", func() bool {
		data, err := os.ReadFile(filepath.Join(dir, ".state", "tasks", id, "status.json"))
		return err == nil && strings.Contains(string(data), `"succeeded"`)
	})

	// The quorum is back with the second node: the result is whole,
	// read through either gateway.
	at = time.Now()
	c.restart(second)
	waitFor(t, 60*time.Second, "the task read again once the quorum is back", func() bool {
		_, ok := tryCall(reader, "task_status", map[string]any{"host": host, "task_id": id, "wait": 0})
		return ok
	})
	t.Logf("quorum back: the task was read through gateway %d %s after gateway %d's restart began",
		last+1, time.Since(at).Round(time.Millisecond), second+1)
	for _, cs := range []*mcp.ClientSession{reader, clientTo(t, c.gw(second).MCPURL(), "")} {
		st, res := awaitTask(t, cs, host, id)
		if st["state"] != "succeeded" || st["output_tail"] != "one\ntwo\n" {
			t.Errorf("the task after the quorum's loss: %s", text(res))
		}
	}
}

// tryCall calls tool once with a short deadline; ok reports an answer
// that is not an error. A failed call returns a nil result.
func tryCall(cs *mcp.ClientSession, tool string, args map[string]any) (res *mcp.CallToolResult, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return nil, false
	}
	return res, !res.IsError
}
