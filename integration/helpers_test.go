package integration

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/agent"
)

func TestMain(m *testing.M) {
	// In-process agents run git through this binary (see AgentConfig).
	if code, ok := agent.RunGitGuard(os.Args); ok {
		os.Exit(code)
	}
	// In-process agents given it as their ConfineHelper confine their
	// commands through it.
	if code, ok := agent.RunConfined(os.Args); ok {
		os.Exit(code)
	}
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(strings.TrimSuffix(binPath, "/fleet-agent"))
	}
	os.Exit(code)
}

// eras are the two MCP protocol eras the gateway serves from one URL.
var eras = []struct{ name, version string }{
	{"sessions-2025", "2025-11-25"},
	{"stateless-2026", ""},
}

// call invokes tool and returns the result; a JSON-RPC error fails the test.
func call(t testing.TB, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

// text joins a result's text contents.
func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// mustOK fails unless res is a success, and returns its text.
func mustOK(t testing.TB, res *mcp.CallToolResult) string {
	t.Helper()
	if res.IsError {
		t.Fatalf("unexpected tool error: %s", text(res))
	}
	return text(res)
}

// mustErr fails unless res is a tool error containing want.
func mustErr(t testing.TB, res *mcp.CallToolResult, want string) string {
	t.Helper()
	if !res.IsError {
		t.Fatalf("expected a tool error containing %q, got success: %s", want, text(res))
	}
	if !strings.Contains(text(res), want) {
		t.Fatalf("tool error %q does not contain %q", text(res), want)
	}
	return text(res)
}

func structured(t testing.TB, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	data, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("structuredContent %s: %v", data, err)
	}
	return m
}

// callOutcome is how a call made with callAsync ended.
type callOutcome struct {
	res *mcp.CallToolResult
	err error
}

// callAsync starts a call and returns where its outcome arrives. It never
// fails the test itself (a t.Fatal outside the test's goroutine would
// leave the test waiting for the outcome): awaitCall does.
func callAsync(cs *mcp.ClientSession, tool string, args map[string]any) <-chan callOutcome {
	done := make(chan callOutcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		done <- callOutcome{res, err}
	}()
	return done
}

// awaitCall waits up to d for a call made with callAsync and returns its
// result; a protocol error or no answer in time fails the test.
func awaitCall(t testing.TB, done <-chan callOutcome, d time.Duration) *mcp.CallToolResult {
	t.Helper()
	select {
	case o := <-done:
		if o.err != nil {
			t.Fatalf("call failed: %v", o.err)
		}
		return o.res
	case <-time.After(d):
		t.Fatalf("no answer to the call within %s", d)
		return nil
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", d, what)
}

// progressLog collects progress notifications.
type progressLog struct {
	mu   sync.Mutex
	msgs []string
	at   []time.Time
}

func (p *progressLog) handler(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, req.Params.Message)
	p.at = append(p.at, time.Now())
}

func (p *progressLog) joined() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.msgs, "")
}

func (p *progressLog) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.msgs)
}

// waitForFile waits for path to hold a whole line and returns it.
func waitForFile(t *testing.T, path string) string {
	t.Helper()
	var data []byte
	waitFor(t, 30*time.Second, path, func() bool {
		var err error
		data, err = os.ReadFile(path)
		return err == nil && strings.HasSuffix(string(data), "\n")
	})
	return strings.TrimSpace(string(data))
}
