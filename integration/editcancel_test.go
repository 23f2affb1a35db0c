package integration

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/agent"
)

// TestEditCancelFreesAgent: a client cancels a long multi-edit of a
// large file; the agent stops it, leaves the file as it was, and its one
// worker serves the next call promptly.
func TestEditCancelFreesAgent(t *testing.T) {
	env := NewEnv(t, Options{Agent: func(c *agent.Config) { c.MaxConcurrent = 1 }})
	dir := env.AgentDir("alpha")
	content := strings.Repeat(strings.Repeat("a", 63)+"\n", 16<<20/64)
	// Every edit rewrites every line: minutes of work however done.
	var edits []map[string]any
	for i := range 1000 {
		from, to := "a", "b"
		if i%2 == 1 {
			from, to = "b", "a"
		}
		edits = append(edits, map[string]any{"old_string": from, "new_string": to, "replace_all": true})
	}
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			cs := env.Client(era.Version, nil)
			big := filepath.Join(dir, "big-"+era.Name+".txt")
			if err := os.WriteFile(big, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "small.txt"), []byte("small\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "edit", Arguments: map[string]any{
					"host": "alpha", "path": big, "edits": edits,
				}})
				errc <- err
			}()
			select {
			case err := <-errc:
				t.Fatalf("the edit ended before it was cancelled: %v", err)
			case <-time.After(time.Second):
			}
			cancel()
			cancelled := time.Now()
			<-errc

			// The agent's only worker must be free again.
			rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer rcancel()
			res, err := cs.CallTool(rctx, &mcp.CallToolParams{Name: "read", Arguments: map[string]any{"host": "alpha", "path": "small.txt"}})
			took := time.Since(cancelled)
			if err != nil {
				t.Fatalf("read after the cancelled edit: %v (after %s)", err, took)
			}
			if !strings.Contains(mustOK(t, res), "small") {
				t.Fatalf("read: %s", text(res))
			}
			t.Logf("next call served %s after the cancel", took.Round(time.Millisecond))
			if took > 5*time.Second {
				t.Errorf("the next call was served %s after the cancel; the cancelled edit kept the worker busy", took)
			}
			if data, err := os.ReadFile(big); err != nil || string(data) != content {
				t.Errorf("the cancelled edit changed the file (%v)", err)
			}
		})
	}
}
