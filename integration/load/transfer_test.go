package load

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/gateway"

	"github.com/fleetmcp/fleetmcp/integration"
)

// writePeak writes content to path on host once, and returns the
// gateway's RSS before and its peak RSS during the write.
func writePeak(t *testing.T, p *integration.GatewayProc, cs *mcp.ClientSession, host, path, content string) (before, peak int64) {
	before, _ = p.Memory()
	p.ResetPeak()
	integration.MustOK(t, integration.Call(t, cs, "write", map[string]any{"host": host, "path": path, "content": content}))
	_, peak = p.Memory()
	return before, peak
}

// TestLargeWriteMemory: a 60 MiB write costs the gateway process less
// than three times its size at its peak (it cost 8 times before the
// arguments were streamed through).
func TestLargeWriteMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a gateway process's memory through large writes: the full run does, -short (the race pass) does not")
	}
	p := integration.StartGatewayProcess(t)
	p.StartAgent("big", nil)
	cs := p.Client()
	integration.MustOK(t, integration.Call(t, cs, "write", map[string]any{"host": "big", "path": "warm.txt", "content": "warm"}))
	content := integration.LargeContent(60)
	before, peak := writePeak(t, p, cs, "big", "big.txt", content)
	growth := float64(peak-before) / float64(len(content))
	t.Logf("60 MiB write: gateway RSS %.0f MiB before, %.0f MiB at its peak: %.2f times the content", float64(before)/integration.MiB, float64(peak)/integration.MiB, growth)
	if growth > 3 {
		t.Errorf("a 60 MiB write grew the gateway by %.2f times its size; want at most 3", growth)
	}
}

// TestLargeWritesShareBudget: four 40 MiB writes at once, under a 64 MiB
// transfer budget, run one at a time (each waits for room), and all
// succeed. Measured on the gateway process: after one such write, the four
// grow it by less than 3/4 of what they grow a gateway whose budget holds
// them all at once; and in process, the budget in use never passes one
// write's size.
func TestLargeWritesShareBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("measures a gateway process's memory through large writes: the full run does, -short (the race pass) does not")
	}
	const budget = 64
	content := integration.LargeContent(40)
	fourWrites := func(t *testing.T, cs *mcp.ClientSession) {
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Go(func() {
				// One after the other, they may take a while on a loaded
				// machine.
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "write", Arguments: map[string]any{"host": "big", "path": fmt.Sprintf("big%d.txt", i), "content": content}})
				if err != nil {
					t.Errorf("write %d: %v", i, err)
					return
				}
				integration.MustOK(t, res)
			})
		}
		wg.Wait()
	}
	t.Run("process", func(t *testing.T) {
		// The same four writes against a gateway whose budget holds them
		// all at once are the floor the budget is measured against.
		growth := func(budgetMiB int) (one, four float64) {
			p := integration.StartGatewayProcess(t, "--max_transfer_mib", fmt.Sprint(budgetMiB), "--transfer_wait", "5m")
			p.StartAgent("big", nil)
			cs := p.Client()
			start, first := writePeak(t, p, cs, "big", "first.txt", content)
			before, _ := p.Memory()
			p.ResetPeak()
			fourWrites(t, cs)
			_, peak := p.Memory()
			p.Stop()
			return float64(first-start) / integration.MiB, float64(peak-before) / integration.MiB
		}
		one, waited := growth(budget)
		_, together := growth(1024)
		t.Logf("one 40 MiB write grew the gateway by %.0f MiB from a fresh start; four at once, after it, by %.0f MiB under a %d MiB budget and by %.0f MiB under a budget that holds them all",
			one, waited, budget, together)
		if waited > 0.75*together {
			t.Errorf("four 40 MiB writes under a %d MiB budget grew the gateway by %.0f MiB, more than 3/4 of the %.0f MiB they take together: they did not wait for each other",
				budget, waited, together)
		}
	})
	t.Run("budget", func(t *testing.T) {
		env := integration.NewEnv(t, integration.Options{Agents: []string{"big"}, Gateway: func(c *gateway.Config) { c.MaxTransferBytes, c.TransferWait = budget*integration.MiB, 5*time.Minute }})
		var most atomic.Int64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				if n := env.Gateway.TransferBytesInUse(); n > most.Load() {
					most.Store(n)
				}
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		fourWrites(t, env.Client("2025-11-25", nil))
		close(stop)
		<-sampled
		if n := most.Load(); n < int64(len(content)) || n > int64(len(content))+integration.MiB {
			t.Errorf("at most %.1f MiB of the budget in use during four 40 MiB writes; want one write's worth", float64(n)/integration.MiB)
		}
	})
}

// gatedTransport holds back the body of the next large request after its
// first 64 KiB until gate is closed, so that a test can keep a large
// transfer in flight.
type gatedTransport struct {
	gate  chan struct{}
	armed atomic.Bool
}

func (g *gatedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.ContentLength > 10*integration.MiB && g.armed.CompareAndSwap(true, false) {
		r = r.Clone(r.Context())
		r.Body = &gatedBody{rc: r.Body, gate: g.gate, free: 64 << 10}
	}
	return http.DefaultTransport.RoundTrip(r)
}

type gatedBody struct {
	rc   io.ReadCloser
	gate chan struct{}
	free int
}

func (b *gatedBody) Read(p []byte) (int, error) {
	if b.free <= 0 {
		<-b.gate
	} else if len(p) > b.free {
		p = p[:b.free]
	}
	n, err := b.rc.Read(p)
	b.free -= n
	return n, err
}

func (b *gatedBody) Close() error { return b.rc.Close() }

// TestLargeTransferBusy: while a large write holds most of a 64 MiB
// transfer budget, another large write waits for room, then is refused as
// busy with an error naming the limit and its flag (and recorded in the
// audit trail); a large read's result likewise. Once the first write is
// done, the budget is free again.
func TestLargeTransferBusy(t *testing.T) {
	env := integration.NewEnv(t, integration.Options{
		Gateway: func(c *gateway.Config) { c.MaxTransferBytes, c.TransferWait = 64*integration.MiB, 300*time.Millisecond },
		Agent:   func(c *agent.Config) { c.BinaryMaxBytes = 64 * integration.MiB },
	})
	if err := os.WriteFile(filepath.Join(env.AgentDir("alpha"), "data.bin"), []byte(integration.LargeContent(30)), 0o644); err != nil {
		t.Fatal(err)
	}
	gated := &gatedTransport{gate: make(chan struct{})}
	gated.armed.Store(true)
	slow, err := env.ClientWith("2025-11-25", &http.Client{Transport: gated})
	if err != nil {
		t.Fatal(err)
	}
	// The first write waits at the gate while the rest of the test runs,
	// which takes minutes under the race detector: it gets its own long
	// deadline, and its outcome comes back on the channel (a t.Fatal in
	// this goroutine would leave the test waiting for it for ever).
	type outcome struct {
		res *mcp.CallToolResult
		err error
	}
	first := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		res, err := slow.CallTool(ctx, &mcp.CallToolParams{Name: "write", Arguments: map[string]any{"host": "alpha", "path": "first.txt", "content": integration.LargeContent(40)}})
		first <- outcome{res, err}
	}()
	integration.WaitFor(t, 20*time.Second, "the first write to take its room", func() bool { return env.Gateway.TransferBytesInUse() >= 40*integration.MiB })

	for _, era := range integration.Eras {
		cs := env.Client(era.Version, nil)
		start := time.Now()
		res := integration.Call(t, cs, "write", map[string]any{"host": "alpha", "path": "second.txt", "content": integration.LargeContent(40)})
		integration.MustErr(t, res, "--max_transfer_mib")
		if waited := time.Since(start); waited < 300*time.Millisecond || !strings.Contains(integration.Text(res), "busy") {
			t.Errorf("%s: second write refused after %s: %s", era.Name, waited, integration.Text(res))
		}
		res = integration.Call(t, cs, "read", map[string]any{"host": "alpha", "path": "data.bin", "binary_base64": true})
		integration.MustErr(t, res, "--max_transfer_mib")
		if !strings.Contains(integration.Text(res), "the result of read on alpha") {
			t.Errorf("%s: read refused with %q", era.Name, integration.Text(res))
		}
	}
	if _, err := os.Stat(filepath.Join(env.AgentDir("alpha"), "second.txt")); err == nil {
		t.Error("a write refused as busy was written")
	}

	close(gated.gate)
	o := <-first
	if o.err != nil {
		t.Fatalf("the first write: %v", o.err)
	}
	integration.MustOK(t, o.res)
	integration.WaitFor(t, 10*time.Second, "the budget to be free", func() bool { return env.Gateway.TransferBytesInUse() == 0 })
	cs := env.Client("2025-11-25", nil)
	res := integration.Call(t, cs, "read", map[string]any{"host": "alpha", "path": "data.bin", "binary_base64": true})
	if len(res.Content) != 2 || len(res.Content[1].(*mcp.TextContent).Text) != 40*integration.MiB {
		t.Errorf("read with the budget free: %d items, %d bytes of text", len(res.Content), len(integration.Text(res)))
	}
	audit := integration.Call(t, cs, "audit", map[string]any{"tool": "write", "decision": "denied"})
	if data, _ := json.Marshal(audit.StructuredContent); !strings.Contains(string(data), `"reason":"gateway busy"`) {
		t.Errorf("no audit record of the busy refusal: %.500s", data)
	}
}

// TestLargeArgumentsArriveWhole: the arguments of large calls reach the
// agent byte for byte, in both protocol eras, though the gateway looks
// only at a shrunk copy of them: a write whose content is full of escapes
// and multi-byte characters, and an edit whose strings are megabytes long.
func TestLargeArgumentsArriveWhole(t *testing.T) {
	env := integration.NewEnv(t)
	var b strings.Builder
	for i := 0; b.Len() < 3*integration.MiB; i++ {
		fmt.Fprintf(&b, "line %d: \"quoted\" back\\slash tab\t é ✓ 😀 \u2028 <&>\n", i)
	}
	content := b.String()
	for _, era := range integration.Eras {
		t.Run(era.Name, func(t *testing.T) {
			cs := env.Client(era.Version, nil)
			path := "whole-" + era.Name + ".txt"
			integration.MustOK(t, integration.Call(t, cs, "write", map[string]any{"host": "alpha", "path": path, "content": content}))
			got, err := os.ReadFile(filepath.Join(env.AgentDir("alpha"), path))
			if err != nil || string(got) != content {
				t.Fatalf("written file has %d bytes (err %v), want the %d sent", len(got), err, len(content))
			}
			oldPart := content[:2*integration.MiB]
			oldPart = oldPart[:strings.LastIndexByte(oldPart, '\n')+1]
			newPart := strings.ToUpper(oldPart)
			integration.MustOK(t, integration.Call(t, cs, "edit", map[string]any{"host": "alpha", "path": path,
				"edits": []map[string]any{{"old_string": oldPart, "new_string": newPart}}}))
			got, _ = os.ReadFile(filepath.Join(env.AgentDir("alpha"), path))
			if string(got) != newPart+content[len(oldPart):] {
				t.Fatalf("edited file differs from the edit sent (%d bytes)", len(got))
			}
		})
	}
	// A call's room is given back once its response is written, which the
	// client may see a moment before the handler returns.
	integration.WaitFor(t, 5*time.Second, "the transfer budget to be free after the calls", func() bool { return env.Gateway.TransferBytesInUse() == 0 })
}
