package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// side is one of the two systems measured: the gateway or the floor.
type side struct {
	name    string
	call    func(ctx context.Context) error
	server  *childproc.Proc // the process whose CPU is counted: the gateway's, the floor server's
	flooder *childproc.Proc
	// runs[i][phase]
	runs [][3]phaseResult
}

// The phases, in order.
var phases = [3]string{"alone", "control", "flood"}

type phaseResult struct {
	p50, p90   time.Duration
	serverCPU  float64 // share of one CPU the server process used while the calls were timed
	flooderCPU float64
	sent       string // the flooder's STOPPED line: reports, renewal requests, answers, seconds
}

// Subjects of the control flood: the victim may publish there, and
// nobody hears them.
var unheard = strings.TrimSuffix(protocol.AgentSubjects(victimHost), ">") + "unheard"

func measure(ctx context.Context, o *options, stdout, stderr io.Writer) error {
	if o.flooderCPU >= 0 {
		if err := pinElsewhere(o.flooderCPU); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp("", "fleetflood")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bins := map[string]string{}
	if o.binDir != "" {
		for _, name := range []string{"fleet-gateway", "fleet-agent", "fleetctl"} {
			bins[name] = filepath.Join(o.binDir, name)
		}
	} else if bins, err = childproc.Build(ctx, dir, "fleet-gateway", "fleet-agent", "fleetctl"); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	rates := []string{"-report_rate", strconv.Itoa(o.reportRate), "-renew_rate", strconv.Itoa(o.renewRate)}
	flooder := func(name string, args ...string) (*childproc.Proc, error) {
		return childproc.Start(ctx, name, command(o.flooderCPU, exe, append(append([]string{"-role", "flooder"}, rates...), args...)...), stderr, time.Minute,
			func(l string) bool { return l == "READY" })
	}

	// The gateway's side, and the victim's files the flooders use.
	fl, err := startFleet(ctx, bins, dir, stderr)
	if err != nil {
		return err
	}
	defer fl.stop()
	gwFlooder, err := flooder("flooder (gateway)", "-nats", fl.natsURL, "-state", fl.victimState)
	if err != nil {
		return err
	}
	defer gwFlooder.Stop()
	// A call really sent to the victim, for the reports about it: seen
	// with the victim's own credential.
	if _, err := gwFlooder.Ask(ctx, 10*time.Second, "capture", "CAPTURING"); err != nil {
		return err
	}
	// The flooder's connection beside the live victim agent is two
	// connections on one identity: once the gateway has seen that (within
	// seconds), it refuses calls to the victim, and then every report is
	// about a call never sent.
	var realID string
	if _, err := fl.bash(ctx, victimHost, "echo real"); err != nil {
		fmt.Fprintf(stderr, "fleetflood: the call to the victim was refused (%v): every report of the flood is about a call never sent\n", err)
	} else {
		line, err := gwFlooder.Expect(ctx, 10*time.Second, func(l string) bool { return strings.HasPrefix(l, "CALL ") })
		if err != nil {
			return err
		}
		realID = strings.TrimPrefix(line, "CALL ")
		if _, err := gwFlooder.Ask(ctx, 10*time.Second, "real "+realID, "REAL"); err != nil {
			return err
		}
	}
	var sides []*side
	if slices.Contains(o.sides, "gateway") {
		sides = append(sides, &side{name: "gateway", server: fl.gw, flooder: gwFlooder, call: func(ctx context.Context) error {
			out, err := fl.bash(ctx, honestHost, "echo ok")
			if err == nil && !strings.Contains(out, "ok") {
				err = fmt.Errorf("bash echo ok answered %q", out)
			}
			return err
		}})
	}

	if slices.Contains(o.sides, "floor") {
		s, stop, err := floorSide(ctx, o, exe, dir, fl, realID, flooder, stderr)
		if err != nil {
			return err
		}
		defer stop()
		sides = append(sides, s)
	}

	pin := "no pinning"
	if o.flooderCPU >= 0 {
		pin = fmt.Sprintf("flooders on CPU %d alone, the rest on the others", o.flooderCPU)
	}
	fmt.Fprintf(stdout, "fleetflood: %d CPUs, %s, %s, load average at start %s; %d runs, phases of %s (a call every %s, at least %d calls); flood of %d reports/s and %d renewal requests/s\n",
		runtime.NumCPU(), runtime.Version(), pin, childproc.LoadAverage(), o.runs, o.phase, o.interval, o.calls, o.reportRate, o.renewRate)
	if err := runSides(ctx, o, sides, stdout); err != nil {
		return err
	}
	report(stdout, sides)
	fmt.Fprintf(stdout, "load average at the end %s\n", childproc.LoadAverage())
	return nil
}

// phase times honest calls of s, one every o.interval (or at once after
// one that took longer), for o.phase and at least o.calls of them, under
// the flood the phase names.
func (s *side) phase(ctx context.Context, o *options, ph string) (phaseResult, error) {
	var res phaseResult
	var subjects string
	switch ph {
	case "control":
		subjects = unheard + ".refused " + unheard + ".renew"
	case "flood":
		subjects = protocol.RefusedSubject(victimHost) + " " + protocol.RenewSubject(victimHost)
	}
	if subjects != "" {
		if _, err := s.flooder.Ask(ctx, 10*time.Second, "start "+subjects, "STARTED"); err != nil {
			return res, err
		}
		sleep(ctx, o.settle)
	}
	var ds []time.Duration
	cpu0, fcpu0, t0 := s.server.CPUSeconds(), s.flooder.CPUSeconds(), time.Now()
	for len(ds) < o.calls || time.Since(t0) < o.phase {
		// One call every o.interval, or at once after one that took
		// longer: both sides do the same calls a second.
		sleep(ctx, time.Until(t0.Add(time.Duration(len(ds))*o.interval)))
		start := time.Now()
		if err := s.call(ctx); err != nil {
			if subjects != "" {
				_, _ = s.flooder.Ask(ctx, 30*time.Second, "stop", "STOPPED")
			}
			return res, err
		}
		ds = append(ds, time.Since(start))
	}
	took := time.Since(t0).Seconds()
	res.serverCPU = (s.server.CPUSeconds() - cpu0) / took
	res.flooderCPU = (s.flooder.CPUSeconds() - fcpu0) / took
	if subjects != "" {
		sent, err := s.flooder.Ask(ctx, 30*time.Second, "stop", "STOPPED")
		if err != nil {
			return res, err
		}
		res.sent = formatSent(sent)
	}
	slices.Sort(ds)
	res.p50, res.p90 = ds[len(ds)/2], ds[len(ds)*9/10]
	// What the flood left queued drains before the next phase.
	sleep(ctx, o.settle)
	return res, nil
}

// formatSent says a flooder's STOPPED line as rates: reports/s,
// renewal requests/s, answers.
func formatSent(line string) string {
	f := strings.Fields(line)
	if len(f) != 4 {
		return line
	}
	secs, _ := strconv.ParseFloat(f[3], 64)
	n := func(s string) float64 { v, _ := strconv.ParseFloat(s, 64); return v }
	if secs <= 0 {
		return line
	}
	return fmt.Sprintf("%.0f+%.0f/s (%s answers)", n(f[0])/secs, n(f[1])/secs, f[2])
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func medianOf(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// report prints, for each side, the medians over the runs of each
// phase's p50 and p90, of each run's ratios, and of the servers' CPU.
func report(w io.Writer, sides []*side) {
	fmt.Fprintf(w, "\nmedians over the runs (ms; ratios are each run's, then their median):\n")
	fmt.Fprintf(w, "%-8s %-28s %-28s %-13s %-13s %-13s %s\n", "side", "p50 alone / control / flood", "p90 alone / control / flood",
		"control/alone", "flood/control", "flood-control", "server CPU alone / control / flood")
	for _, s := range sides {
		var p50, p90, cpu [3][]float64
		var ctlAlone, floodCtl, delta []float64
		for _, r := range s.runs {
			for i := range phases {
				p50[i] = append(p50[i], float64(r[i].p50)/1e6)
				p90[i] = append(p90[i], float64(r[i].p90)/1e6)
				cpu[i] = append(cpu[i], 100*r[i].serverCPU)
			}
			ctlAlone = append(ctlAlone, ratio(r[1].p50, r[0].p50))
			floodCtl = append(floodCtl, ratio(r[2].p50, r[1].p50))
			delta = append(delta, float64(r[2].p50-r[1].p50)/1e6)
		}
		m := func(xs [3][]float64, f string) string {
			return fmt.Sprintf(f+" / "+f+" / "+f, medianOf(xs[0]), medianOf(xs[1]), medianOf(xs[2]))
		}
		fmt.Fprintf(w, "%-8s %-28s %-28s %-13s %-13s %-13s %s\n", s.name, m(p50, "%.2f"), m(p90, "%.2f"),
			fmt.Sprintf("%.2fx", medianOf(ctlAlone)), fmt.Sprintf("%.2fx", medianOf(floodCtl)), fmt.Sprintf("%+.2f ms", medianOf(delta)), m(cpu, "%.0f%%"))
		fmt.Fprintf(w, "%-8s flood/control of each run: %s\n", "", joinRatios(floodCtl))
	}
}

func joinRatios(xs []float64) string {
	var b strings.Builder
	for i, x := range xs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%.2fx", x)
	}
	return b.String()
}

// floorSide starts the floor's side: a bare NATS server behind an HTTP
// endpoint, a responder doing the honest call's work, and the same flood
// from the victim's files; stop ends them.
func floorSide(ctx context.Context, o *options, exe, dir string, fl *fleet, realID string, flooder func(string, ...string) (*childproc.Proc, error),
	stderr io.Writer) (s *side, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	floorDir := filepath.Join(dir, "floor")
	if err := os.MkdirAll(floorDir, 0o700); err != nil {
		return nil, stop, err
	}
	var url, natsURL string
	server, err := childproc.Start(ctx, "floor server", command(-1, exe, "-role", "floor", "-dir", floorDir), stderr, time.Minute, func(l string) bool {
		rest, ok := strings.CutPrefix(l, "READY ")
		url, natsURL, _ = strings.Cut(rest, " ")
		return ok
	})
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, server.Stop)
	responder, err := childproc.Start(ctx, "floor responder", command(-1, exe, "-role", "responder", "-nats", natsURL,
		"-creds", filepath.Join(floorDir, "floor-responder.creds"), "-call_bytes", strconv.Itoa(o.callBytes), "-floor_command", o.floorCommand), stderr, time.Minute,
		func(l string) bool { return l == "READY" })
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, responder.Stop)
	floorFlooder, err := flooder("flooder (floor)", "-nats", natsURL, "-state", fl.victimState, "-creds", filepath.Join(floorDir, "floor-victim.creds"))
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, floorFlooder.Stop)
	if realID != "" {
		if _, err := floorFlooder.Ask(ctx, 10*time.Second, "real "+realID, "REAL"); err != nil {
			return nil, stop, err
		}
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}, Timeout: 30 * time.Second}
	// A call's request as an MCP client sends it, about 200 bytes.
	body := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"bash","arguments":{"host":"honest","command":"echo ok"},"_meta":{"progressToken":7}}}`)
	return &side{name: "floor", server: server, flooder: floorFlooder, call: func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/call", bytes.NewReader(body))
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil && (resp.StatusCode != http.StatusOK || n != int64(o.callBytes)) {
			err = fmt.Errorf("floor call: %s, %d bytes", resp.Status, n)
		}
		return err
	}}, stop, nil
}

// runSides measures every side o.runs times, alternating their order,
// and prints each run.
func runSides(ctx context.Context, o *options, sides []*side, stdout io.Writer) error {
	for r := range o.runs {
		order := slices.Clone(sides)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			var res [3]phaseResult
			for i, ph := range phases {
				var err error
				if res[i], err = s.phase(ctx, o, ph); err != nil {
					return fmt.Errorf("run %d, %s, %s: %w", r+1, s.name, ph, err)
				}
			}
			s.runs = append(s.runs, res)
			fmt.Fprintf(stdout, "run %d %-8s p50 %s / %s / %s  p90 %s / %s / %s  flood/control %.2fx  server CPU %.0f%% / %.0f%% / %.0f%%  flooder CPU %.0f%% / %.0f%%  sent (control) %s  (flood) %s\n",
				r+1, s.name, ms(res[0].p50), ms(res[1].p50), ms(res[2].p50), ms(res[0].p90), ms(res[1].p90), ms(res[2].p90),
				ratio(res[2].p50, res[1].p50), 100*res[0].serverCPU, 100*res[1].serverCPU, 100*res[2].serverCPU,
				100*res[1].flooderCPU, 100*res[2].flooderCPU, res[1].sent, res[2].sent)
		}
	}
	return nil
}
