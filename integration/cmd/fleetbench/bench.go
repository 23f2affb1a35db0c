package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The protocol eras: the client asks for 2025-11-25 (and gets a session)
// or for nothing, and so the newest the SDK knows: 2026-07-28, stateless.
const (
	era2025 = "2025-11-25"
	era2026 = ""
)

var eras = []struct{ name, version string }{{"2025", era2025}, {"2026", era2026}}

// connect opens a go-sdk client session to url in the given era, over a
// transport that keeps up to 16 connections idle (so that c=8 reuses
// its connections, as a concurrent client would).
func connect(ctx context.Context, url, version string) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "fleetbench", Version: "1"}, nil)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute}}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return c.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, DisableStandaloneSSE: true}, &mcp.ClientSessionOptions{ProtocolVersion: version})
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

// A case is one measured call: a tool of one target, in one era, at one
// concurrency.
type bcase struct {
	name   string // what is called: "read 4 KiB"
	target string // floor, relay, signed relay (the relay floor), dev (the gateway's own agent), agent (a separate process), local
	era    string // 2025, 2026, or "" (local)
	conc   int
	bytes  int // payload bytes per call, for MB/s; 0: none
	calls  int
	call   func(ctx context.Context, worker, i int) error
	// figures of each round
	p50, p99 []time.Duration
	rate     []float64
	cpu      map[string][]float64 // CPU seconds per call of the named process, each round
}

func (c *bcase) key() string { return fmt.Sprintf("%s|%s|%s|%d", c.name, c.target, c.era, c.conc) }

type bench struct {
	o        *options
	fleet    *fleet
	floor    *childproc.Proc
	sessions []*mcp.ClientSession
	cases    []*bcase
	byKey    map[string]*bcase
	small    string
	large    []byte
	largeB64 string
}

func newBench(ctx context.Context, o *options, floor *childproc.Proc, floorURL string, fl *fleet, work string) (*bench, error) {
	b := &bench{o: o, fleet: fl, floor: floor, byKey: map[string]*bcase{}, small: string(smallText(o.smallSize)), large: payload(o.largeSize)}
	b.largeB64 = base64.StdEncoding.EncodeToString(b.large)
	largeText := strings.Repeat("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n", o.largeSize/64+1)[:o.largeSize]
	for _, era := range eras {
		floor, err := b.session(ctx, floorURL+"/"+era.name, era.version)
		if err != nil {
			return nil, fmt.Errorf("floor server, %s era: %w", era.name, err)
		}
		gw, err := b.session(ctx, fl.mcpURL, era.version)
		if err != nil {
			return nil, fmt.Errorf("gateway, %s era: %w", era.name, err)
		}
		for _, c := range o.concurrency {
			b.add(&bcase{name: "echo", target: "floor", era: era.name, conc: c, calls: o.calls, call: func(ctx context.Context, _, _ int) error {
				return expect(floor.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"}}))("hi")
			}})
			b.add(&bcase{name: "blob 5 MB", target: "floor", era: era.name, conc: c, bytes: o.largeSize, calls: o.largeCalls, call: func(ctx context.Context, _, _ int) error {
				res, err := floor.CallTool(ctx, &mcp.CallToolParams{Name: "blob", Arguments: map[string]any{"size": o.largeSize}})
				return b.checkLarge(res, err)
			}})
			b.add(&bcase{name: "sink 5 MB", target: "floor", era: era.name, conc: c, bytes: o.largeSize, calls: o.largeCalls, call: func(ctx context.Context, _, _ int) error {
				return expect(floor.CallTool(ctx, &mcp.CallToolParams{Name: "sink", Arguments: map[string]any{"data": largeText}}))(fmt.Sprintf("%d bytes", o.largeSize))
			}})
			for _, relay := range []struct{ tool, target string }{{"relay", "relay"}, {"signed_relay", "signed relay"}} {
				b.add(&bcase{name: "read 4 KiB", target: relay.target, era: era.name, conc: c, calls: o.calls, call: func(ctx context.Context, _, _ int) error {
					return expect(floor.CallTool(ctx, &mcp.CallToolParams{Name: relay.tool, Arguments: map[string]any{"path": filepath.Join(work, "small.txt")}}))(b.small)
				}})
			}
			for _, host := range []string{devHost, agentHost} {
				b.addFleet(gw, host, era.name, c, work, largeText)
			}
		}
	}
	for _, c := range o.concurrency {
		b.add(&bcase{name: "bash echo hi", target: "local", conc: c, calls: o.calls, call: func(ctx context.Context, _, _ int) error {
			out, err := exec.CommandContext(ctx, "bash", "-c", "echo hi").Output()
			if err == nil && string(out) != "hi\n" {
				err = fmt.Errorf("local bash said %q", out)
			}
			return err
		}})
	}
	return b, nil
}

func (b *bench) session(ctx context.Context, url, version string) (*mcp.ClientSession, error) {
	cs, err := connect(ctx, url, version)
	if err == nil {
		b.sessions = append(b.sessions, cs)
	}
	return cs, err
}

func (b *bench) close() {
	for _, cs := range b.sessions {
		_ = cs.Close()
	}
}

func targetOf(host string) string {
	switch host {
	case devHost:
		return "dev"
	case agentHost:
		return "agent"
	}
	return host
}

// addFleet adds the cases of one host through the gateway.
func (b *bench) addFleet(gw *mcp.ClientSession, host, era string, c int, work, largeText string) {
	o, t := b.o, targetOf(host)
	call := func(ctx context.Context, args map[string]any) (*mcp.CallToolResult, error) {
		args["host"] = host
		name := args["tool"].(string)
		delete(args, "tool")
		return gw.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	}
	wrote := fmt.Sprintf("wrote %d bytes", o.smallSize)
	b.add(&bcase{name: "read 4 KiB", target: t, era: era, conc: c, calls: o.calls, call: func(ctx context.Context, _, _ int) error {
		return expect(call(ctx, map[string]any{"tool": "read", "path": filepath.Join(work, "small.txt")}))(b.small)
	}})
	b.add(&bcase{name: "write 4 KiB", target: t, era: era, conc: c, calls: o.calls, call: func(ctx context.Context, w, _ int) error {
		path := filepath.Join(work, fmt.Sprintf("w-%s-%s-%d.txt", t, era, w))
		return expectPrefix(call(ctx, map[string]any{"tool": "write", "path": path, "content": b.small}))(wrote)
	}})
	b.add(&bcase{name: "bash echo hi", target: t, era: era, conc: c, calls: o.calls, call: func(ctx context.Context, _, _ int) error {
		return expect(call(ctx, map[string]any{"tool": "bash", "command": "echo hi"}))("hi\n")
	}})
	b.add(&bcase{name: "read 5 MB", target: t, era: era, conc: c, bytes: o.largeSize, calls: o.largeCalls, call: func(ctx context.Context, _, _ int) error {
		res, err := call(ctx, map[string]any{"tool": "read", "path": filepath.Join(work, "large.bin"), "binary_base64": true})
		return b.checkLarge(res, err)
	}})
	b.add(&bcase{name: "write 5 MB", target: t, era: era, conc: c, bytes: o.largeSize, calls: o.largeCalls, call: func(ctx context.Context, w, _ int) error {
		path := filepath.Join(work, fmt.Sprintf("big-%s-%s-%d.txt", t, era, w))
		return expectPrefix(call(ctx, map[string]any{"tool": "write", "path": path, "content": largeText}))(fmt.Sprintf("wrote %d bytes", o.largeSize))
	}})
}

func (b *bench) add(c *bcase) {
	b.cases = append(b.cases, c)
	b.byKey[c.key()] = c
}

// checkLarge checks a result whose last content is the large payload in
// base64.
func (b *bench) checkLarge(res *mcp.CallToolResult, err error) error {
	if err != nil {
		return err
	}
	if res.IsError || len(res.Content) == 0 {
		return fmt.Errorf("large read failed: %.300s", resultText(res))
	}
	t, ok := res.Content[len(res.Content)-1].(*mcp.TextContent)
	if !ok || t.Text != b.largeB64 {
		return fmt.Errorf("large read: the data differs from the file's (%d content items)", len(res.Content))
	}
	return nil
}

func expect(res *mcp.CallToolResult, err error) func(want string) error {
	return func(want string) error {
		if err != nil {
			return err
		}
		if got := resultText(res); res.IsError || got != want {
			return fmt.Errorf("unexpected result (error %v): %.300q", res.IsError, got)
		}
		return nil
	}
}

func expectPrefix(res *mcp.CallToolResult, err error) func(want string) error {
	return func(want string) error {
		if err != nil {
			return err
		}
		if got := resultText(res); res.IsError || !strings.Contains(got, want) {
			return fmt.Errorf("unexpected result (error %v): %.300q, want one saying %q", res.IsError, got, want)
		}
		return nil
	}
}

// selected reports whether case c is measured: it matches -only, or it
// is the floor of a case that does.
func (b *bench) selected(c *bcase) bool {
	if b.o.only.String() == "" || b.o.only.MatchString(c.name) {
		return true
	}
	for _, d := range b.cases {
		if d.target != "floor" && d.target != "local" && b.o.only.MatchString(d.name) && floorName(d.name) == c.name {
			return true
		}
	}
	return false
}

// floorName is the name of the floor case a case is compared with.
func floorName(name string) string {
	switch name {
	case "read 4 KiB", "write 4 KiB":
		return "echo"
	case "read 5 MB":
		return "blob 5 MB"
	case "write 5 MB":
		return "sink 5 MB"
	}
	return name
}

// measure runs a warm-up, then the rounds.
func (b *bench) measure(ctx context.Context, stdout io.Writer) error {
	for _, c := range b.cases {
		if !b.selected(c) {
			continue
		}
		if _, err := load(ctx, c.conc, min(c.calls, 2*c.conc), c.call); err != nil {
			return fmt.Errorf("warm-up of %s (%s, era %s, c=%d): %w", c.name, c.target, c.era, c.conc, err)
		}
	}
	for r := range b.o.rounds {
		start := time.Now()
		for _, c := range b.cases {
			if !b.selected(c) {
				continue
			}
			gw0, ag0 := b.fleet.gw.CPUSeconds(), b.fleet.agent.CPUSeconds()
			st, err := load(ctx, c.conc, c.calls, c.call)
			if err != nil {
				return fmt.Errorf("round %d, %s (%s, era %s, c=%d): %w", r+1, c.name, c.target, c.era, c.conc, err)
			}
			c.p50, c.p99, c.rate = append(c.p50, st.p50), append(c.p99, st.p99), append(c.rate, st.rate)
			if c.target == "dev" || c.target == "agent" {
				if c.cpu == nil {
					c.cpu = map[string][]float64{}
				}
				n := float64(c.calls)
				c.cpu["gateway"] = append(c.cpu["gateway"], (b.fleet.gw.CPUSeconds()-gw0)/n)
				c.cpu["agent"] = append(c.cpu["agent"], (b.fleet.agent.CPUSeconds()-ag0)/n)
			}
		}
		fmt.Fprintf(stdout, "round %d of %d: %s (load average %s)\n", r+1, b.o.rounds, time.Since(start).Round(100*time.Millisecond), childproc.LoadAverage())
	}
	return nil
}

type stats struct {
	p50, p99 time.Duration
	rate     float64
}

// load makes n calls of fn across conc goroutines.
func load(ctx context.Context, conc, n int, fn func(ctx context.Context, worker, i int) error) (stats, error) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var failed error
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	start := time.Now()
	for w := range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n || cctx.Err() != nil {
					return
				}
				t0 := time.Now()
				if err := fn(cctx, w, i); err != nil {
					once.Do(func() { failed = err; cancel() })
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if failed != nil {
		return stats{}, failed
	}
	if err := cctx.Err(); err != nil {
		return stats{}, err
	}
	slices.Sort(lat)
	return stats{p50: lat[len(lat)/2], p99: lat[min(len(lat)*99/100, len(lat)-1)], rate: float64(n) / elapsed.Seconds()}, nil
}

// perf records the CPU profiles of the gateway and agent processes while
// 4 KiB reads go to each host, and of the floor server while it echoes.
func (b *bench) perf(ctx context.Context, dir string, stdout, stderr io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, host := range []string{agentHost, devHost, "floor"} {
		c := b.byKey[(&bcase{name: "read 4 KiB", target: targetOf(host), era: "2025", conc: 1}).key()]
		procs := map[string]*childproc.Proc{"gateway": b.fleet.gw, "agent": b.fleet.agent}
		if host == devHost {
			delete(procs, "agent")
		}
		if host == "floor" {
			c = b.byKey[(&bcase{name: "echo", target: "floor", era: "2025", conc: 1}).key()]
			procs = map[string]*childproc.Proc{"server": b.floor}
		}
		if c == nil {
			return fmt.Errorf("-perf needs concurrency 1 among -concurrency")
		}
		var recs []*exec.Cmd
		for name, p := range procs {
			file := filepath.Join(dir, targetOf(host)+"-"+name+".data")
			rec := exec.Command("perf", "record", "-q", "-F", "1999", "-g", "-p", strconv.Itoa(p.Pid()), "-o", file)
			rec.Stderr = stderr
			if err := rec.Start(); err != nil {
				return fmt.Errorf("perf record: %w", err)
			}
			recs = append(recs, rec)
			fmt.Fprintf(stdout, "recording %s while reading from %s: %s\n", name, host, file)
		}
		time.Sleep(500 * time.Millisecond) // perf attaches
		st, err := load(ctx, 1, b.o.perfCalls, c.call)
		for _, rec := range recs {
			_ = rec.Process.Signal(syscall.SIGINT)
			_ = rec.Wait()
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%d calls of %s (%s) while recording: p50 %s\n", b.o.perfCalls, c.name, describeTarget(c.target), ms(st.p50))
	}
	return nil
}
