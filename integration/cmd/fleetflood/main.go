// Command fleetflood measures what a flooding host costs the other
// hosts' calls, as a user's processes see it, against the floor of what
// the same flood costs with no gateway logic at all.
//
// The system: a fleet-gateway --dev process (embedded NATS server in
// operator mode, on loopback TCP), two fleet-agent processes joined to it
// (honest and victim), and a flooder process (this binary, -role flooder)
// that holds the victim's own files from its state directory (key,
// credential, CA), as the owner of a compromised host does. It floods
// signed refusal reports (forged caller and text, every 50th about a call
// really sent to the victim) and signed renewal requests at fixed rates
// (-report_rate, -renew_rate). This process is the caller: it times
// bash "echo ok" calls to the honest host through the gateway's MCP
// endpoint, one every -call_interval (so that both sides make the same
// calls a second, and their servers' CPU compares), in three phases:
// alone, under a control flood (the same messages at the same rates on a
// subject of the victim's that nobody hears: what the flooder and the
// NATS server's reading of its messages cost the machine) and under the
// flood. Each phase times calls for -phase, and at least -calls of them.
//
// The floor, in the same run, with the same flooder and the same
// messages and rates: a server process (-role floor) with an embedded
// nats-server in the same operator mode, a connection in process that
// hears the reports and renewal requests on the gateway's subjects and
// drops them (answering each renewal request with a fixed refusal of the
// size of the gateway's), and an HTTP endpoint that relays a call over
// NATS to a responder in a process of its own (-role responder), which
// runs bash -c "echo ok" as the agent does (-floor_command) and answers
// with -call_bytes. The honest round trip, HTTP to the server, a NATS
// request to the responder and its bash, is timed in the same three
// phases: the same work as the gateway's call, without the gateway's and
// the agent's logic around it.
//
// The flood's cost is the ratio flood/control of each side's median; the
// floor's ratio is what NATS delivery and dropping cost on this machine,
// so what the gateway adds is its ratio beyond the floor's. With
// -flooder_cpu N the flooders run on CPU N alone and everything else on
// the other CPUs: what remains of the ratio then is not the flooder's
// CPU contention.
//
// Each run measures both sides, alternating which goes first; the
// figures printed are each run's and their medians over the runs.
//
//	go run ./integration/cmd/fleetflood -runs 5
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "fleetflood:", err)
		}
		os.Exit(1)
	}
}

type options struct {
	runs         int
	calls        int
	phase        time.Duration
	interval     time.Duration
	settle       time.Duration
	reportRate   int
	renewRate    int
	callBytes    int
	floorCommand string
	flooderCPU   int
	binDir       string
	sides        []string
	// internal, of the child roles
	role     string
	dir      string
	natsURL  string
	creds    string
	stateDir string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("fleetflood", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.IntVar(&o.runs, "runs", 5, "runs; each measures both sides in the three phases, and the figures are medians over them")
	fs.DurationVar(&o.phase, "phase", 3*time.Second, "how long each phase times honest calls, one after another")
	fs.DurationVar(&o.interval, "call_interval", 20*time.Millisecond, "how often an honest call starts (at once after one that took longer); 0: back to back")
	fs.IntVar(&o.calls, "calls", 20, "honest calls timed per phase at least, however long they take")
	fs.DurationVar(&o.settle, "settle", 500*time.Millisecond, "how long a flood runs before its phase's calls are timed, and the pause after it")
	fs.IntVar(&o.reportRate, "report_rate", 33_000, "refusal reports a second the flooder sends")
	fs.IntVar(&o.renewRate, "renew_rate", 3_300, "renewal requests a second the flooder sends")
	fs.IntVar(&o.callBytes, "call_bytes", 1024, "bytes of the floor responder's answer")
	fs.StringVar(&o.floorCommand, "floor_command", "echo ok", "what the floor responder runs with bash -c for each call, as the agent does for the honest call (empty: nothing, an echo of bytes)")
	fs.IntVar(&o.flooderCPU, "flooder_cpu", -1, "run the flooders on this CPU alone and everything else on the other CPUs (Linux; -1: no pinning)")
	fs.StringVar(&o.binDir, "bin_dir", "", "a directory holding fleet-gateway, fleet-agent and fleetctl (default: built from this module)")
	sides := fs.String("sides", "gateway,floor", "what to measure: gateway, floor, or both (comma-separated)")
	fs.StringVar(&o.role, "role", "", "internal: flooder, floor or responder")
	fs.StringVar(&o.dir, "dir", "", "internal: the floor's directory")
	fs.StringVar(&o.natsURL, "nats", "", "internal: the NATS server to connect to")
	fs.StringVar(&o.creds, "creds", "", "internal: the credential to connect with")
	fs.StringVar(&o.stateDir, "state", "", "internal: the flooder's host's state directory")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q: all options are flags (see -h)", fs.Arg(0))
	}
	for _, s := range strings.Split(*sides, ",") {
		switch s = strings.TrimSpace(s); s {
		case "gateway", "floor":
			o.sides = append(o.sides, s)
		default:
			return nil, fmt.Errorf("-sides %q: want gateway, floor or both, comma-separated", *sides)
		}
	}
	switch {
	case o.role != "" && o.role != "flooder" && o.role != "floor" && o.role != "responder":
		return nil, fmt.Errorf("-role %q: want flooder, floor or responder (all internal)", o.role)
	case o.runs < 1 || o.runs > 100:
		return nil, fmt.Errorf("-runs %d: want 1 to 100", o.runs)
	case o.calls < 3 || o.calls > 100_000:
		return nil, fmt.Errorf("-calls %d: want 3 to 100,000", o.calls)
	case o.phase < 0 || o.phase > 10*time.Minute:
		return nil, fmt.Errorf("-phase %s: want 0 to 10m", o.phase)
	case o.interval < 0 || o.interval > time.Minute:
		return nil, fmt.Errorf("-call_interval %s: want 0 to 1m", o.interval)
	case o.settle < 0 || o.settle > time.Minute:
		return nil, fmt.Errorf("-settle %s: want 0 to 1m", o.settle)
	case o.reportRate < 1 || o.reportRate > 1_000_000, o.renewRate < 1 || o.renewRate > 1_000_000:
		return nil, errors.New("-report_rate and -renew_rate: want 1 to 1,000,000 a second")
	case o.callBytes < 1 || o.callBytes > 1<<20:
		return nil, fmt.Errorf("-call_bytes %d: want 1 to 1 MiB", o.callBytes)
	case o.flooderCPU >= 0 && !canPin:
		return nil, errors.New("-flooder_cpu needs Linux")
	case o.flooderCPU < -1:
		return nil, fmt.Errorf("-flooder_cpu %d: want a CPU number, or -1", o.flooderCPU)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	switch o.role {
	case "flooder":
		return runFlooder(ctx, o, stdin, stdout)
	case "floor":
		return runFloor(ctx, o, stdout)
	case "responder":
		return runResponder(ctx, o, stdout)
	}
	return measure(ctx, o, stdout, &childproc.LockedWriter{W: stderr})
}
