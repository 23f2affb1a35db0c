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

// Main runs the tests of a package of this harness: call it from the
// package's TestMain as os.Exit(integration.Main(m)). In-process agents
// run git through the test binary and confine their commands through it,
// so the test binary must answer those calls first; the programs the
// harness built are removed after the run.
func Main(m *testing.M) int {
	// In-process agents run git through this binary (see AgentConfig).
	if code, ok := agent.RunGitGuard(os.Args); ok {
		return code
	}
	// In-process agents given it as their ConfineHelper confine their
	// commands through it.
	if code, ok := agent.RunConfined(os.Args); ok {
		return code
	}
	code := m.Run()
	removeBuilt()
	return code
}

// Eras are the two MCP protocol eras the gateway serves from one URL: a
// subtest name and the client's protocol version ("" is the newest).
var Eras = []struct{ Name, Version string }{
	{"sessions-2025", "2025-11-25"},
	{"stateless-2026", ""},
}

// Call invokes tool and returns the result; a JSON-RPC error fails the test.
func Call(t testing.TB, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

// Text joins a result's text contents.
func Text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// MustOK fails unless res is a success, and returns its text.
func MustOK(t testing.TB, res *mcp.CallToolResult) string {
	t.Helper()
	if res.IsError {
		t.Fatalf("unexpected tool error: %s", Text(res))
	}
	return Text(res)
}

// MustErr fails unless res is a tool error containing want.
func MustErr(t testing.TB, res *mcp.CallToolResult, want string) string {
	t.Helper()
	if !res.IsError {
		t.Fatalf("expected a tool error containing %q, got success: %s", want, Text(res))
	}
	if !strings.Contains(Text(res), want) {
		t.Fatalf("tool error %q does not contain %q", Text(res), want)
	}
	return Text(res)
}

// Structured returns a result's structured content as a map.
func Structured(t testing.TB, res *mcp.CallToolResult) map[string]any {
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

// CallOutcome is how a call made with callAsync ended.
type CallOutcome struct {
	res *mcp.CallToolResult
	err error
}

// CallAsync starts a call and returns where its outcome arrives. It never
// fails the test itself (a t.Fatal outside the test's goroutine would
// leave the test waiting for the outcome): AwaitCall does.
func CallAsync(cs *mcp.ClientSession, tool string, args map[string]any) <-chan CallOutcome {
	done := make(chan CallOutcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		done <- CallOutcome{res, err}
	}()
	return done
}

// AwaitCall waits up to d for a call made with CallAsync and returns its
// result; a protocol error or no answer in time fails the test.
func AwaitCall(t testing.TB, done <-chan CallOutcome, d time.Duration) *mcp.CallToolResult {
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

// WaitFor polls cond until it holds or d passes.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
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

// ProgressLog collects progress notifications.
type ProgressLog struct {
	mu   sync.Mutex
	msgs []string
	at   []time.Time
}

// Handler records a notification: a client's ProgressNotificationHandler.
func (p *ProgressLog) Handler(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, req.Params.Message)
	p.at = append(p.at, time.Now())
}

// Joined is the notifications' messages, in order, joined.
func (p *ProgressLog) Joined() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.msgs, "")
}

// Times returns when each notification arrived.
func (p *ProgressLog) Times() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.at...)
}

// Count is the number of notifications so far.
func (p *ProgressLog) Count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.msgs)
}

// WaitForFile waits for path to hold a whole line and returns it.
func WaitForFile(t *testing.T, path string) string {
	t.Helper()
	var data []byte
	WaitFor(t, 30*time.Second, path, func() bool {
		var err error
		data, err = os.ReadFile(path)
		return err == nil && strings.HasSuffix(string(data), "\n")
	})
	return strings.TrimSpace(string(data))
}
