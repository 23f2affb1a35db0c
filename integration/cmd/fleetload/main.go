// Command fleetload measures fan-out at scale on one machine. It runs the
// gateway, with its embedded NATS server, in a child process (this same
// binary with -role gateway), starts N simulated agents in its own process
// (package simfleet: one NATS connection and operator-mode credential
// each, the real wire protocol, the agent's reconnect backoff), and drives
// the gateway with the go-sdk MCP client over HTTP. It reports:
//
//   - how long enrolling N agents takes: by default as hosts do it (each
//     makes its key and enrols over HTTPS with one join token, a signed
//     request each, -enrol_conns at a time), or with -enrol local through
//     the gateway's in-process enrolment; -enrol_only stops there;
//   - fleet_read of a small file and fleet_bash "true" across all N hosts:
//     p50 and p90 of the client-side latency over -runs runs;
//   - the gateway process's memory per connected idle host: its RSS (after
//     a GC that returns freed memory to the OS) with N agents connected,
//     minus its RSS before any agent connected, divided by N;
//   - a NATS restart: the gateway process (and so its NATS server) is
//     stopped and started again on the same ports, and the time until
//     every agent has rejoined and announced itself is measured, with the
//     spread of their reconnects.
//
// With -mode rollout it measures skill rollout instead (rollout.go): the
// time until every simulated host has installed a newly pushed skill,
// and the JetStream consumers that takes.
//
// All traffic stays on 127.0.0.1; every wait is bounded.
//
//	go run ./integration/cmd/fleetload -hosts 1000,10000 -runs 5
//	go run ./integration/cmd/fleetload -mode rollout -hosts 1000,10000 -runs 3
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
	"github.com/fleetmcp/fleetmcp/integration/simfleet"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "fleetload:", err)
		}
		os.Exit(1)
	}
}

type options struct {
	role           string
	hosts          []int
	runs           int
	concurrency    []int
	settle         time.Duration
	restart        bool
	latency        bool
	restartProf    string
	restartProfSec int
	dataDir        string
	listen         string
	natsListen     string
	statsListen    string
	apiListen      string
	enrolVia       string
	enrolOnly      bool
	enrolConns     int
	profile        string
	soak           int
	mode           string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("fleetload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	hosts := fs.String("hosts", "1000,10000", "fleet sizes to measure, comma-separated")
	fs.IntVar(&o.runs, "runs", 5, "measured runs of each fan-out per fleet size (after one warm-up)")
	concurrency := fs.String("concurrency", "0", "max_concurrency values to measure, comma-separated (0: the gateway's default)")
	fs.DurationVar(&o.settle, "settle", 10*time.Second, "idle time before memory is measured")
	fs.IntVar(&o.soak, "soak", 0, "after the latency runs, this many more fleet_bash calls, then the gateway's memory again (what a used fleet costs)")
	fs.BoolVar(&o.restart, "restart", true, "measure reconnection after a NATS restart")
	fs.BoolVar(&o.latency, "latency", true, "measure fan-out latency (false: only joining, memory and the restart)")
	fs.StringVar(&o.restartProf, "restart_profile", "", "write the gateway's CPU profile over the -restart_profile_seconds after its restart begins to this file")
	fs.IntVar(&o.restartProfSec, "restart_profile_seconds", 20, "how long -restart_profile profiles")
	fs.StringVar(&o.profile, "cpuprofile", "", "write the gateway's CPU profile during the fleet_read runs to this file, and its heap profile at the end to FILE.heap")
	fs.StringVar(&o.enrolVia, "enrol", "https", "how the agents enrol: https (a join token each through the fleet API, as hosts do) or local (the gateway's in-process enrolment)")
	fs.BoolVar(&o.enrolOnly, "enrol_only", false, "measure the enrolment only, then stop")
	fs.IntVar(&o.enrolConns, "enrol_conns", 64, "with -enrol https: concurrent enrolments (HTTPS connections)")
	fs.StringVar(&o.mode, "mode", "fanout", "what to measure: fanout (fan-out latency, memory, restart) or rollout (skill rollout to every host)")
	fs.StringVar(&o.role, "role", "", "internal: 'gateway' runs the gateway child")
	fs.StringVar(&o.dataDir, "data_dir", "", "internal: the gateway child's data directory")
	fs.StringVar(&o.listen, "listen", "", "internal: the gateway child's MCP address")
	fs.StringVar(&o.natsListen, "nats_listen", "", "internal: the gateway child's NATS address")
	fs.StringVar(&o.statsListen, "stats_listen", "", "internal: the gateway child's stats address")
	fs.StringVar(&o.apiListen, "api_listen", "", "internal: the gateway child's fleet API address")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: all options are flags (see -h)", fs.Arg(0))
	}
	for _, s := range strings.Split(*hosts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 || n > 50000 {
			return nil, fmt.Errorf("-hosts %q: want fleet sizes from 1 to 50000, comma-separated", *hosts)
		}
		o.hosts = append(o.hosts, n)
	}
	for _, s := range strings.Split(*concurrency, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 0 || c > 500 {
			return nil, fmt.Errorf("-concurrency %q: want values from 0 to 500, comma-separated", *concurrency)
		}
		o.concurrency = append(o.concurrency, c)
	}
	if o.enrolVia != "https" && o.enrolVia != "local" {
		return nil, fmt.Errorf("-enrol %q: want https or local", o.enrolVia)
	}
	if o.enrolConns < 1 || o.enrolConns > 1024 {
		return nil, fmt.Errorf("-enrol_conns %d: want 1 to 1024", o.enrolConns)
	}
	if o.mode != "fanout" && o.mode != "rollout" {
		return nil, fmt.Errorf("-mode %q: want fanout or rollout", o.mode)
	}
	if o.restartProfSec < 1 || o.restartProfSec > 300 {
		return nil, fmt.Errorf("-restart_profile_seconds %d: want 1 to 300", o.restartProfSec)
	}
	if o.runs < 1 || o.runs > 100 {
		return nil, fmt.Errorf("-runs %d: want 1 to 100", o.runs)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if err := raiseFileLimit(); err != nil {
		return err
	}
	if o.role == "gateway" {
		return runGateway(ctx, o, stdout, stderr)
	}
	fmt.Fprintf(stdout, "fleetload: %d CPUs, load average at start %s\n", runtime.NumCPU(), childproc.LoadAverage())
	for _, n := range o.hosts {
		if err := measure(ctx, o, n, stdout, stderr); err != nil {
			return fmt.Errorf("%d hosts: %w", n, err)
		}
	}
	return nil
}

// hostName is the name of simulated host i.
func hostName(i int) string { return fmt.Sprintf("sim-%05d", i) }

// stats is what the gateway child reports about itself.
type stats struct {
	RSSKB      int64   `json:"rss_kb"`
	HeapInuse  uint64  `json:"heap_inuse"`
	StackInuse uint64  `json:"stack_inuse"`
	Goroutines int     `json:"goroutines"`
	Online     int     `json:"online"`
	CPUSeconds float64 `json:"cpu_seconds"`
}

// runGateway is the child: the gateway with its embedded NATS server, and
// a stats endpoint on loopback.
func runGateway(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// The stats server comes first, so that the gateway's start can be
	// profiled (-restart_profile); /stats answers once the gateway runs.
	ln, err := net.Listen("tcp", o.statsListen)
	if err != nil {
		return err
	}
	var running atomic.Pointer[gateway.Gateway]
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		gw := running.Load()
		if gw == nil {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		n, _ := strconv.Atoi(r.URL.Query().Get("hosts"))
		st := stats{}
		for i := range n {
			if h, ok := gw.Host(hostName(i)); ok && h.Online {
				st.Online++
			}
		}
		if r.URL.Query().Get("gc") != "" {
			debug.FreeOSMemory()
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		st.HeapInuse, st.StackInuse, st.Goroutines = ms.HeapInuse, ms.StackInuse, runtime.NumGoroutine()
		st.RSSKB = procStatusKB("VmRSS")
		st.CPUSeconds = cpuSeconds()
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("POST /enrol", func(w http.ResponseWriter, r *http.Request) {
		if gw := running.Load(); gw != nil {
			enrolHandler(gw, w, r)
			return
		}
		http.Error(w, "starting", http.StatusServiceUnavailable)
	})
	skillHandlers(mux, &running)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.Handle("GET /debug/pprof/heap", pprof.Handler("heap"))
	mux.Handle("GET /debug/pprof/goroutine", pprof.Handler("goroutine"))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	defer func() { _ = srv.Close(); <-served }()
	gw, err := gateway.Start(ctx, gateway.Config{
		Listen: o.listen, DataDir: o.dataDir, NATSListen: o.natsListen, APIListen: o.apiListen, AuthDisabled: true, Logger: log,
	})
	if err != nil {
		return err
	}
	running.Store(gw)
	fmt.Fprintf(stdout, "READY %s %s %s %s\n", gw.MCPURL(), gw.NATSURL(), gw.APIURL(), gw.APICAPin())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return gw.Shutdown(sctx)
}

func procStatusKB(field string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}

// child is a running gateway child process.
type child struct {
	cmd     *exec.Cmd
	mcpURL  string
	natsURL string
	// apiURL and apiPin are the fleet API's URL and CA pin.
	apiURL, apiPin string
	stats          string
	done           chan struct{}
}

func startChild(ctx context.Context, o *options, dataDir string, addrs [4]string, stderr io.Writer) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	listen, natsListen, statsListen := addrs[0], addrs[1], addrs[2]
	cmd := exec.Command(exe, "-role", "gateway", "-data_dir", dataDir, "-listen", listen, "-nats_listen", natsListen, "-stats_listen", statsListen,
		"-api_listen", addrs[3])
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stats: "http://" + statsListen + "/stats", done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				ready <- line
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(c.done) }()
	select {
	case line := <-ready:
		f := strings.Fields(line)
		if len(f) != 4 {
			c.stop()
			return nil, fmt.Errorf("gateway child said %q", line)
		}
		c.mcpURL, c.natsURL, c.apiURL, c.apiPin = f[0], f[1], f[2], f[3]
		return c, nil
	case <-c.done:
		return nil, errors.New("gateway child exited before it was ready")
	case <-time.After(3 * time.Minute):
		c.stop()
		return nil, errors.New("gateway child not ready within 3 min")
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
}

// stop asks the child to shut down and waits (killing it after 30 s).
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

func (c *child) get(hosts int, gc bool) (stats, error) {
	url := c.stats + "?hosts=" + strconv.Itoa(hosts)
	if gc {
		url += "&gc=1"
	}
	hc := http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return stats{}, err
	}
	defer resp.Body.Close()
	var st stats
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// profileStart writes the CPU profile of the gateway child being
// started over its first -restart_profile_seconds to file.
func (b *bench) profileStart(file string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := net.DialTimeout("tcp", b.addrs[2], time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the gateway child's stats server did not come up: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := &child{stats: "http://" + b.addrs[2] + "/stats"}
	return c.profile(file, b.o.restartProfSec)
}

// profile writes the child's CPU profile over the next seconds to file.
func (c *child) profile(file string, seconds int) error {
	return c.fetch("/debug/pprof/profile?seconds="+strconv.Itoa(seconds), file)
}

// fetch writes what the child's stats server answers at path to file.
func (c *child) fetch(path, file string) error {
	hc := http.Client{Timeout: 2 * time.Minute}
	resp, err := hc.Get(strings.TrimSuffix(c.stats, "/stats") + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// waitOnline waits until the gateway sees n hosts online.
func (c *child) waitOnline(ctx context.Context, n int, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	for time.Since(start) < limit {
		st, err := c.get(n, false)
		if err == nil && st.Online == n {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	st, _ := c.get(n, false)
	return 0, fmt.Errorf("only %d of %d hosts online after %s", st.Online, n, limit)
}

// smallFile is the file every simulated host serves to fleet_read.
const smallFile = "/etc/fleet/app.conf"

// bench is the measurement of one fleet size.
type bench struct {
	o       *options
	n       int
	dataDir string
	addrs   [4]string // MCP, NATS, stats and fleet API addresses of the gateway child
	gw      *child
	fleet   *simfleet.Fleet
	stdout  io.Writer
	stderr  io.Writer
}

func (b *bench) startGateway(ctx context.Context) error {
	gw, err := startChild(ctx, b.o, b.dataDir, b.addrs, b.stderr)
	b.gw = gw
	return err
}

func measure(ctx context.Context, o *options, n int, stdout, stderr io.Writer) error {
	b := &bench{o: o, n: n, stdout: stdout, stderr: stderr}
	var err error
	if b.dataDir, err = os.MkdirTemp("", "fleetload"); err != nil {
		return err
	}
	defer os.RemoveAll(b.dataDir)
	for i := range b.addrs {
		if b.addrs[i], err = childproc.FreeAddr(); err != nil {
			return err
		}
	}
	if err := b.startGateway(ctx); err != nil {
		return err
	}
	defer func() {
		if b.gw != nil {
			b.gw.stop()
		}
	}()
	time.Sleep(2 * time.Second)
	base, err := b.gw.get(0, true)
	if err != nil {
		return err
	}

	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = hostName(i)
	}
	enrol := b.enrol
	if o.enrolVia == "https" {
		enrol = b.enrolHTTPS
	}
	creds, keys, err := enrol(ctx, hosts)
	if err != nil {
		return err
	}
	if o.enrolOnly {
		return nil
	}
	if o.mode == "rollout" {
		return measureRollout(ctx, b, hosts, creds, keys)
	}
	joinStart := time.Now()
	b.fleet, err = simfleet.Start(ctx, simfleet.Config{
		URL: b.gw.natsURL, Hosts: hosts, SigningKeys: keys,
		Credentials: func(h string) (simfleet.Credential, error) { return creds[h], nil },
		Handler:     simfleet.DefaultHandler(map[string]string{smallFile: "worker_processes 4;\nlisten 8080;\n"}),
	})
	if err != nil {
		return err
	}
	defer b.fleet.Close()
	if _, err := b.gw.waitOnline(ctx, n, 3*time.Minute); err != nil {
		return err
	}
	joined := time.Since(joinStart)
	time.Sleep(o.settle)
	idle, err := b.gw.get(n, true)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\n== %d hosts (joined in %s; load average %s)\n", n, joined.Round(10*time.Millisecond), childproc.LoadAverage())
	fmt.Fprintf(stdout, "gateway memory: RSS %.1f MiB idle without agents, %.1f MiB with %d idle agents: %.1f KB per host (heap %.1f KB/host, stacks %.1f KB/host, goroutines %d -> %d)\n",
		float64(base.RSSKB)/1024, float64(idle.RSSKB)/1024, n, float64(idle.RSSKB-base.RSSKB)/float64(n),
		float64(int64(idle.HeapInuse)-int64(base.HeapInuse))/1024/float64(n), float64(int64(idle.StackInuse)-int64(base.StackInuse))/1024/float64(n),
		base.Goroutines, idle.Goroutines)

	if err := b.calls(ctx, base); err != nil {
		return err
	}
	if o.profile != "" {
		if err := b.gw.fetch("/debug/pprof/heap?gc=1", o.profile+".heap"); err != nil {
			return err
		}
	}
	if !o.restart {
		return nil
	}
	return b.restart(ctx)
}

// soak runs o.soak fan-outs and reports the gateway's memory after them,
// against base, its memory before any agent connected.
func (b *bench) soak(ctx context.Context, cs *mcp.ClientSession, base stats) error {
	start := time.Now()
	for range b.o.soak {
		if d, err := fanout(ctx, cs, "fleet_bash", fanoutArgs("fleet_bash", 0), b.n); d == 0 {
			return err
		}
	}
	took := time.Since(start)
	time.Sleep(b.o.settle)
	used, err := b.gw.get(b.n, true)
	if err != nil {
		return err
	}
	fmt.Fprintf(b.stdout, "after %d more fleet_bash calls (%s): gateway RSS %.1f MiB: %.1f KB per host (heap %.1f KB/host)\n",
		b.o.soak, took.Round(time.Second), float64(used.RSSKB)/1024, float64(used.RSSKB-base.RSSKB)/float64(b.n),
		float64(int64(used.HeapInuse)-int64(base.HeapInuse))/1024/float64(b.n))
	return nil
}

// fanoutArgs are the arguments of the measured fan-outs.
func fanoutArgs(tool string, concurrency int) map[string]any {
	args := map[string]any{"selector": "role=sim", "command": "true"}
	if tool == "fleet_read" {
		args = map[string]any{"selector": "role=sim", "path": smallFile}
	}
	if concurrency > 0 {
		args["max_concurrency"] = concurrency
	}
	return args
}

// latency measures one fan-out tool: a warm-up run, then o.runs runs.
func (b *bench) latency(ctx context.Context, cs *mcp.ClientSession, tool string, concurrency int) error {
	var took []time.Duration
	cpu0, _ := b.gw.get(0, false)
	sim0 := cpuSeconds()
	profDone := make(chan error, 1)
	if b.o.profile != "" && tool == "fleet_read" {
		go func() { profDone <- b.gw.profile(b.o.profile, 8) }()
	} else {
		profDone <- nil
	}
	for r := 0; r <= b.o.runs; r++ {
		d, err := fanout(ctx, cs, tool, fanoutArgs(tool, concurrency), b.n)
		if d == 0 {
			return err
		}
		if err != nil {
			fmt.Fprintf(b.stdout, "WARNING: run %d: %v\n", r, err)
		}
		if r > 0 { // the first run warms up
			took = append(took, d)
		}
	}
	cpu1, _ := b.gw.get(0, false)
	sim1 := cpuSeconds()
	after, _ := b.gw.get(0, true)
	if err := <-profDone; err != nil {
		return err
	}
	fmt.Fprintf(b.stdout, "%s runs: %v\n", tool, took)
	slices.Sort(took)
	fmt.Fprintf(b.stdout, "%s across %d hosts (max_concurrency %s): p50 %s, p90 %s, min %s, max %s over %d runs; CPU per call %.2f s in the gateway, %.2f s in the simulated hosts (and this client); gateway heap %.0f MiB, RSS %.0f MiB after\n",
		tool, b.n, concurrencyLabel(concurrency), pct(took, 50), pct(took, 90), took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), len(took),
		(cpu1.CPUSeconds-cpu0.CPUSeconds)/float64(b.o.runs+1), (sim1-sim0)/float64(b.o.runs+1), float64(after.HeapInuse)/(1<<20), float64(after.RSSKB)/1024)
	return nil
}

func concurrencyLabel(c int) string {
	if c == 0 {
		return "default"
	}
	return strconv.Itoa(c)
}

// restart stops the gateway (and with it NATS), starts it again on the
// same ports and measures how the agents return.
func (b *bench) restart(ctx context.Context) error {
	n := b.n
	conns := b.fleet.Conns.Load()
	down := time.Now()
	b.gw.stop()
	b.gw = nil
	stopped := time.Since(down)
	started := time.Now()
	profDone := make(chan error, 1)
	if b.o.restartProf != "" {
		go func() { profDone <- b.profileStart(b.o.restartProf) }()
	} else {
		profDone <- nil
	}
	if err := b.startGateway(ctx); err != nil {
		return err
	}
	ready := time.Now()
	online, err := b.gw.waitOnline(ctx, n, 2*time.Minute)
	if err != nil {
		connected := b.fleet.Connected()
		fmt.Fprintf(b.stdout, "%d of %d simulated agents connected, after %d connections\n", connected, n, b.fleet.Conns.Load()-conns)
		for msg, count := range b.fleet.ReconnectErrors() {
			fmt.Fprintf(b.stdout, "failed reconnect attempts: %d × %s\n", count, msg)
		}
		return err
	}
	back := b.fleet.ReconnectedSince(down)
	slices.SortFunc(back, func(a, b time.Time) int { return a.Compare(b) })
	if len(back) < n {
		return fmt.Errorf("only %d of %d agents reconnected", len(back), n)
	}
	// The spread: the busiest 100 ms, and the first and last reconnect.
	peak := 0
	for i, j := 0, 0; i < len(back); i++ {
		for back[i].Sub(back[j]) > 100*time.Millisecond {
			j++
		}
		peak = max(peak, i-j+1)
	}
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	for msg, count := range b.fleet.ReconnectErrors() {
		fmt.Fprintf(b.stdout, "failed reconnect attempts: %d × %s\n", count, msg)
	}
	made := b.fleet.Conns.Load() - conns
	at := func(p int) time.Duration { return r(back[(len(back)-1)*p/100].Sub(started)) }
	fmt.Fprintf(b.stdout, "the agents made %d connections to come back (%d handshakes begun and not finished); back after the new process's start: p50 %s, p90 %s, p99 %s\n",
		made, made-int64(n), at(50), at(90), at(99))
	fmt.Fprintf(b.stdout, "NATS restart: gateway stopped in %s; its new process (NATS taking agents from its start) ready %s after it was started; "+
		"all %d agents reconnected within %s of the new process's start (first %s, last %s), the gateway saw all online %s after it was ready; busiest 100 ms: %d reconnects (%.0f%%)\n",
		r(stopped), r(ready.Sub(started)), n, r(back[len(back)-1].Sub(started)), r(back[0].Sub(started)), r(back[len(back)-1].Sub(started)), r(online), peak, 100*float64(peak)/float64(n))
	if err := <-profDone; err != nil {
		return fmt.Errorf("restart profile: %w", err)
	}
	cs, err := connect(ctx, b.gw.mcpURL)
	if err != nil {
		return err
	}
	defer cs.Close()
	d, err := fanout(ctx, cs, "fleet_bash", fanoutArgs("fleet_bash", 0), n)
	if err != nil {
		fmt.Fprintf(b.stdout, "WARNING: after the restart: %v\n", err)
	} else {
		fmt.Fprintf(b.stdout, "after the restart: fleet_bash \"true\" reached all %d hosts in %s\n", n, d.Round(time.Millisecond))
	}
	return nil
}

func connect(ctx context.Context, url string) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "fleetload", Version: "1"}, nil)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return c.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: url, DisableStandaloneSSE: true}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
}

// fanout calls tool and checks that every host succeeded.
func fanout(ctx context.Context, cs *mcp.ClientSession, tool string, args map[string]any, n int) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", tool, err)
	}
	var sc struct {
		Counts map[string]int `json:"counts"`
	}
	data, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(data, &sc); err != nil || sc.Counts["succeeded"] != n {
		text := ""
		if len(res.Content) > 0 {
			if t, ok := res.Content[0].(*mcp.TextContent); ok {
				text = t.Text
			}
		}
		return took, fmt.Errorf("%s: %d of %d hosts succeeded: %.700s", tool, sc.Counts["succeeded"], n, text)
	}
	return took, nil
}

func pct(d []time.Duration, p int) time.Duration {
	i := (len(d)*p + 99) / 100
	return d[max(min(i, len(d))-1, 0)].Round(time.Millisecond)
}

// calls measures the calls' latency at each concurrency asked for, then
// soaks the fleet when asked to, through one MCP session.
func (b *bench) calls(ctx context.Context, base stats) error {
	cs, err := connect(ctx, b.gw.mcpURL)
	if err != nil {
		return err
	}
	defer cs.Close()
	for _, c := range b.o.concurrency {
		if !b.o.latency {
			break
		}
		for _, tool := range []string{"fleet_read", "fleet_bash"} {
			if err := b.latency(ctx, cs, tool, c); err != nil {
				return err
			}
		}
	}
	if b.o.soak > 0 {
		return b.soak(ctx, cs, base)
	}
	return nil
}
