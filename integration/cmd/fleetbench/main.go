// Command fleetbench measures the cost of one tool call as a user's
// client sees it: the client (the go-sdk v1.8.0 MCP client, in this
// process) calls a fleet-gateway --dev process over HTTP, reaching either
// the gateway's in-process agent or a separate fleet-agent process joined
// to it over NATS, and, in the same run, the floor of the stack: bare
// go-sdk streamable-HTTP servers of both protocol eras (2025 sessions,
// 2026-07-28 stateless) in a process of their own (this binary with
// -role floor), and the floor of the design: the same bare server
// relaying each read over NATS to a responder in a process of its own
// (-role relay), once as it is and once with the four signatures of signed
// calls (relay.go).
//
// Every round measures every case once, interleaved; the figures printed
// are medians over the rounds of each round's p50, p99 and calls/s (and
// MB/s for the large transfers), then their ratios to the floors:
//
//   - read and write of 4 KiB against the bare echo of the same era, and
//     the relay floor's reads of 4 KiB against it too;
//   - bash "echo hi" against a local spawn of bash -c 'echo hi' here;
//   - read of 5 MB with binary_base64 and write of 5 MB against the bare
//     server returning or taking the same bytes, and 100 MB/s.
//
// With -perf DIR it then records the gateway's and the agent's CPU
// profiles (perf record, call graphs) over -perf_calls reads of 4 KiB,
// and the floor server's over as many echoes.
//
// All traffic stays on 127.0.0.1; every wait is bounded.
//
//	go run ./integration/cmd/fleetbench -rounds 5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "fleetbench:", err)
		}
		os.Exit(1)
	}
}

type options struct {
	role        string
	listen      string
	rounds      int
	calls       int
	largeCalls  int
	smallSize   int
	largeSize   int
	concurrency []int
	only        *regexp.Regexp
	gatewayBin  string
	agentBin    string
	perfDir     string
	perfCalls   int
	// the floor's and the relay responder's (internal)
	keyFile string
	natsURL string
	dir     string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("fleetbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.IntVar(&o.rounds, "rounds", 5, "rounds; each measures every case once, and the figures are medians over them")
	fs.IntVar(&o.calls, "calls", 400, "calls per case and round of the small cases (4 KiB read and write, bash, the bare echo)")
	fs.IntVar(&o.largeCalls, "large_calls", 8, "calls per case and round of the large transfers")
	fs.IntVar(&o.smallSize, "small_size", 4096, "bytes of the small read and write")
	fs.IntVar(&o.largeSize, "large_size", 5_000_000, "bytes of the large read (binary_base64) and write")
	conc := fs.String("concurrency", "1,8", "client concurrency levels, comma-separated")
	only := fs.String("only", "", "measure only the cases whose name matches this regular expression (the floors they are compared with too)")
	fs.StringVar(&o.gatewayBin, "gateway_bin", "", "the fleet-gateway binary (default: built from this module)")
	fs.StringVar(&o.agentBin, "agent_bin", "", "the fleet-agent binary (default: built from this module)")
	fs.StringVar(&o.perfDir, "perf", "", "after the rounds, record the gateway's and agent's CPU profiles with perf into this directory")
	fs.IntVar(&o.perfCalls, "perf_calls", 3000, "with -perf: 4 KiB reads (c=1, 2025 era) to each host while recording")
	fs.StringVar(&o.role, "role", "", "internal: 'floor' runs the bare go-sdk servers, 'relay' the relay floor's responder")
	fs.StringVar(&o.listen, "listen", "", "internal: the floor server's address")
	fs.StringVar(&o.keyFile, "keys", "", "internal: the relay floor's keys")
	fs.StringVar(&o.natsURL, "nats", "", "internal: the relay floor's NATS server")
	fs.StringVar(&o.dir, "dir", "", "internal: the directory the relay responder reads")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: all options are flags (see -h)", fs.Arg(0))
	}
	for _, s := range strings.Split(*conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 || c > 64 {
			return nil, fmt.Errorf("-concurrency %q: want values from 1 to 64, comma-separated", *conc)
		}
		o.concurrency = append(o.concurrency, c)
	}
	re, err := regexp.Compile(*only)
	if err != nil {
		return nil, fmt.Errorf("-only %q: %w", *only, err)
	}
	o.only = re
	switch {
	case o.role != "" && o.role != "floor" && o.role != "relay":
		return nil, fmt.Errorf("-role %q: want floor or relay (both internal)", o.role)
	case o.rounds < 1 || o.rounds > 100:
		return nil, fmt.Errorf("-rounds %d: want 1 to 100", o.rounds)
	case o.calls < 1 || o.calls > 1_000_000, o.largeCalls < 1 || o.largeCalls > 10_000, o.perfCalls < 1 || o.perfCalls > 1_000_000:
		return nil, errors.New("-calls, -large_calls and -perf_calls: want at least 1 (and at most 1,000,000, 10,000 and 1,000,000)")
	case o.smallSize < 1 || o.smallSize > 40<<10:
		return nil, fmt.Errorf("-small_size %d: want 1 to 40960 bytes (a read shows at most 50 KB)", o.smallSize)
	case o.largeSize < 1 || o.largeSize > 20<<20:
		return nil, fmt.Errorf("-large_size %d: want 1 to 20 MiB (the agent's default binary_max_bytes)", o.largeSize)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	switch o.role {
	case "floor":
		return runFloor(ctx, o.listen, o.keyFile, stdout)
	case "relay":
		return runRelay(ctx, o.natsURL, o.keyFile, o.dir, stdout)
	}
	// Every child's standard error is copied here by a goroutine of its own.
	stderr = &childproc.LockedWriter{W: stderr}
	dir, err := os.MkdirTemp("", "fleetbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if o.gatewayBin == "" || o.agentBin == "" {
		bins, err := childproc.Build(ctx, dir, "fleet-gateway", "fleet-agent")
		if err != nil {
			return err
		}
		o.gatewayBin, o.agentBin = orDefault(o.gatewayBin, bins["fleet-gateway"]), orDefault(o.agentBin, bins["fleet-agent"])
	}
	work := filepath.Join(dir, "files")
	if err := writeFiles(work, o); err != nil {
		return err
	}
	floor, floorURL, err := startFloor(ctx, dir, work, stderr)
	if err != nil {
		return err
	}
	defer floor.stop()
	fl, err := startFleet(ctx, o.gatewayBin, o.agentBin, dir, work, stderr)
	if err != nil {
		return err
	}
	defer fl.stop()
	b, err := newBench(ctx, o, floor.server, floorURL, fl, work)
	if err != nil {
		return err
	}
	defer b.close()
	fmt.Fprintf(stdout, "fleetbench: %d CPUs, %s, load average at start %s; %d rounds\n", runtime.NumCPU(), runtime.Version(), childproc.LoadAverage(), o.rounds)
	if err := b.measure(ctx, stdout); err != nil {
		return err
	}
	b.report(stdout)
	fmt.Fprintf(stdout, "load average at the end %s\n", childproc.LoadAverage())
	if o.perfDir != "" {
		return b.perf(ctx, o.perfDir, stdout, stderr)
	}
	return nil
}

func orDefault(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// writeFiles makes the files the reads read.
func writeFiles(work string, o *options) error {
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, "small.txt"), smallText(o.smallSize), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(work, "large.bin"), payload(o.largeSize), 0o644)
}

// smallText is n bytes of text in 64-byte lines.
func smallText(n int) []byte {
	line := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n"
	return []byte(strings.Repeat(line, n/len(line)+1)[:n])
}
