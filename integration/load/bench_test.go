package load

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/gateway"

	"github.com/fleetmcp/fleetmcp/integration"
)

// The benchmarks measure the full path — go-sdk client → HTTP → gateway →
// NATS → agent → and back — next to the floor of the stack: a bare go-sdk
// streamable-HTTP server with one echo tool, driven by the same client in
// the same run. Compare ratios, not absolute numbers; see the README.
//
//	go test ./integration/load -run '^$' -bench . -benchtime 3s -count 5

// load runs b.N calls of fn across conc goroutines and reports latency
// percentiles and throughput.
func load(b *testing.B, conc int, fn func() error) {
	b.Helper()
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				t0 := time.Now()
				if err := fn(); err != nil {
					failed.Store(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "calls/s")
}

var benchConcurrency = []int{1, 8}

var benchEras = []struct{ name, version string }{
	{"2025", "2025-11-25"},
	{"2026", ""},
}

type echoIn struct {
	Text string `json:"text"`
}

// BenchmarkBareEcho is the floor: go-sdk server and client, nothing else.
func BenchmarkBareEcho(b *testing.B) {
	s := mcp.NewServer(&mcp.Implementation{Name: "echo", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
	})
	for _, era := range benchEras {
		h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: era.version == ""})
		srv := httptest.NewServer(h)
		cs := benchClient(b, srv.URL, era.version)
		for _, conc := range benchConcurrency {
			b.Run(fmt.Sprintf("era=%s/c=%d", era.name, conc), func(b *testing.B) {
				load(b, conc, func() error {
					res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}})
					return check(res, err, "hi")
				})
			})
		}
		cs.Close()
		srv.Close()
	}
}

// BenchmarkRead4K reads a 4 KiB file through the whole fleet path.
func BenchmarkRead4K(b *testing.B) {
	env := integration.NewEnv(b, integration.Options{Quiet: true})
	content := strings.Repeat("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n", 64)
	if err := os.WriteFile(filepath.Join(env.AgentDir("alpha"), "4k.txt"), []byte(content), 0o644); err != nil {
		b.Fatal(err)
	}
	for _, era := range benchEras {
		cs := benchClient(b, env.Gateway.MCPURL(), era.version)
		for _, conc := range benchConcurrency {
			b.Run(fmt.Sprintf("era=%s/c=%d", era.name, conc), func(b *testing.B) {
				load(b, conc, func() error {
					res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "read", Arguments: map[string]any{"host": "alpha", "path": "4k.txt"}})
					return check(res, err, content)
				})
			})
		}
		cs.Close()
	}
}

// BenchmarkBashEcho runs `echo hi` through the whole fleet path.
func BenchmarkBashEcho(b *testing.B) {
	env := integration.NewEnv(b, integration.Options{Quiet: true})
	for _, era := range benchEras {
		cs := benchClient(b, env.Gateway.MCPURL(), era.version)
		for _, conc := range benchConcurrency {
			b.Run(fmt.Sprintf("era=%s/c=%d", era.name, conc), func(b *testing.B) {
				load(b, conc, func() error {
					res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "alpha", "command": "echo hi"}})
					return check(res, err, "hi\n")
				})
			})
		}
		cs.Close()
	}
}

// BenchmarkLocalBashSpawn is the floor for bash: a plain local spawn.
func BenchmarkLocalBashSpawn(b *testing.B) {
	for _, conc := range benchConcurrency {
		b.Run(fmt.Sprintf("c=%d", conc), func(b *testing.B) {
			load(b, conc, func() error {
				out, err := exec.Command("bash", "-c", "echo hi").Output()
				if err == nil && string(out) != "hi\n" {
					err = fmt.Errorf("got %q", out)
				}
				return err
			})
		})
	}
}

func benchClient(b *testing.B, url, version string) *mcp.ClientSession {
	b.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		b.Fatal(err)
	}
	return cs
}

func check(res *mcp.CallToolResult, err error, want string) error {
	if err != nil {
		return err
	}
	if res.IsError || integration.Text(res) != want {
		return fmt.Errorf("unexpected result (error=%v): %.200q", res.IsError, integration.Text(res))
	}
	return nil
}

// BenchmarkTracing measures a 4 KiB read with tracing off (no tracer
// provider: the default) and on (the OpenTelemetry SDK, every call
// sampled, spans batched to an exporter that drops them: the cost of
// making and propagating spans, not of sending them). Off is the path
// every call takes unless --otlp_endpoint is given; compare it with
// BenchmarkRead4K of a build without tracing.
func BenchmarkTracing(b *testing.B) {
	content := strings.Repeat("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n", 64)
	for _, on := range []bool{false, true} {
		var opts integration.Options
		if on {
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			opts = integration.Options{Gateway: func(c *gateway.Config) { c.TracerProvider = tp }, Agent: func(c *agent.Config) { c.TracerProvider = tp }}
		}
		opts.Quiet = true
		env := integration.NewEnv(b, opts)
		if err := os.WriteFile(filepath.Join(env.AgentDir("alpha"), "4k.txt"), []byte(content), 0o644); err != nil {
			b.Fatal(err)
		}
		cs := benchClient(b, env.Gateway.MCPURL(), "2025-11-25")
		for _, conc := range benchConcurrency {
			b.Run(fmt.Sprintf("tracing=%v/c=%d", on, conc), func(b *testing.B) {
				b.ReportAllocs()
				load(b, conc, func() error {
					res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "read", Arguments: map[string]any{"host": "alpha", "path": "4k.txt"}})
					return check(res, err, content)
				})
			})
		}
		cs.Close()
	}
}

// discardSpans is a span exporter that drops what it gets.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }
