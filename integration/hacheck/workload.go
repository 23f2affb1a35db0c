// Package hacheck checks what a fleet of gateway replicas promises when
// parts of it fail, in the spirit of Jepsen's analyses: it runs
// concurrent tool calls and enrolments across the replicas while its
// caller injects faults, keeps the history of what every client saw, and
// afterwards checks the audit stream, the join token and the registries
// against that history: every call a client saw answered has exactly one
// audit record, no record is stored twice or belongs to no call, every
// acknowledged enrolment is in the agent records and counted once on its
// token, and every replica lists the same hosts.
//
// Faults are the caller's (integration tests stop gateways and their NATS
// nodes, or cut a node's link); it marks them in the history
// so that the report can say what each one cost. Tool calls go to
// simulated hosts (package simfleet) as bash "echo TAG", with TAG also in
// the call's _meta execution_id, which the gateway copies into the
// call's audit record.
package hacheck

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Config is a workload.
type Config struct {
	// Gateways are the replicas' MCP URLs.
	Gateways []string
	// Hosts are the hosts tool calls go to (online for the whole run).
	Hosts []string
	// Workers are concurrent MCP clients; worker w starts on gateway
	// w mod len(Gateways) and speaks Eras[w mod len(Eras)].
	Workers int
	// Eras are the MCP protocol versions the workers speak
	// ("2025-11-25": sessions; "": the SDK's latest, stateless). Default
	// both.
	Eras []string
	// CallTimeout bounds one call as its client waits for it. Default 30 s.
	CallTimeout time.Duration
	// Think is each worker's pause between calls. Default 10 ms.
	Think time.Duration
	// Enrol, when set, enrols a new host through replica i (its fleet API
	// with one join token); one worker does it every EnrolEvery.
	Enrol      func(ctx context.Context, replica int, host string) error
	EnrolEvery time.Duration
	// RunID starts every tag and enrolled host name, so that records of
	// other runs are told apart. Default: random.
	RunID string
}

// Outcome is what the client of one operation saw.
type Outcome string

const (
	// OK: the call was answered with its result.
	OK Outcome = "ok"
	// ToolError: answered with a tool error (the host's, or a refusal).
	ToolError Outcome = "tool_error"
	// Withheld: the call ran but its record was not stored in time, so
	// the gateway answered with an error instead of its result.
	Withheld Outcome = "withheld"
	// Refused: not run, because the audit trail did not take records.
	Refused Outcome = "refused"
	// Failed: no answer (connection lost, session gone, timeout): the
	// call may or may not have run.
	Failed Outcome = "failed"
)

// Op is one operation and what its client saw.
type Op struct {
	Kind       string // "call" or "enrol"
	Worker     int
	Gateway    int
	Era        string
	Tag        string // the call's execution_id, or the enrolled host
	Host       string
	Start, End time.Time
	Outcome    Outcome
	Err        string
}

// Mark is a fault, or the end of one, at a time.
type Mark struct {
	At   time.Time
	What string
}

// History is what happened in a run.
type History struct {
	RunID string
	mu    sync.Mutex
	ops   []Op
	marks []Mark
}

// Mark notes a fault (or its end) now.
func (h *History) Mark(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.marks = append(h.marks, Mark{At: time.Now(), What: what})
}

// Ops returns the operations so far.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Marks returns the marks so far.
func (h *History) Marks() []Mark {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Mark(nil), h.marks...)
}

func (h *History) add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Run starts the workload and returns its history at once; the workers
// run until ctx ends, and wait returns when they all have.
func Run(ctx context.Context, cfg Config) (h *History, wait func()) {
	if len(cfg.Eras) == 0 {
		cfg.Eras = []string{"2025-11-25", ""}
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 30 * time.Second
	}
	if cfg.Think == 0 {
		cfg.Think = 10 * time.Millisecond
	}
	if cfg.RunID == "" {
		cfg.RunID = fmt.Sprintf("r%06x", rand.N(1<<24))
	}
	h = &History{RunID: cfg.RunID}
	var wg sync.WaitGroup
	for w := range cfg.Workers {
		wg.Go(func() {
			(&worker{cfg: &cfg, h: h, id: w, era: cfg.Eras[w%len(cfg.Eras)], home: w % len(cfg.Gateways)}).run(ctx)
		})
	}
	if cfg.Enrol != nil {
		wg.Go(func() { enrolLoop(ctx, &cfg, h) })
	}
	return h, wg.Wait
}

// worker is one MCP client. On an answerless call it moves on to the
// next gateway, as a client behind a load balancer would be moved, and
// starts a new session there (2025) or just sends its next call there
// (2026).
type worker struct {
	cfg  *Config
	h    *History
	id   int
	era  string
	home int
	gw   int
	cs   *mcp.ClientSession
	seq  int
}

func (w *worker) run(ctx context.Context) {
	w.gw = w.home
	defer func() {
		if w.cs != nil {
			_ = w.cs.Close()
		}
	}()
	for ctx.Err() == nil {
		if w.cs == nil && !w.connect(ctx) {
			return
		}
		w.call(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(w.cfg.Think):
		}
	}
}

// connect connects to the current gateway, trying the next ones in turn
// until one answers or ctx ends.
func (w *worker) connect(ctx context.Context) bool {
	client := mcp.NewClient(&mcp.Implementation{Name: "hacheck", Version: "1"}, nil)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		cs, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: w.cfg.Gateways[w.gw], DisableStandaloneSSE: true},
			&mcp.ClientSessionOptions{ProtocolVersion: w.era})
		cancel()
		if err == nil {
			w.cs = cs
			return true
		}
		w.gw = (w.gw + 1) % len(w.cfg.Gateways)
		if attempt%len(w.cfg.Gateways) == len(w.cfg.Gateways)-1 {
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return false
}

// call makes one tool call and records what its client saw.
func (w *worker) call(ctx context.Context) {
	w.seq++
	tag := fmt.Sprintf("%s-w%d-%d", w.cfg.RunID, w.id, w.seq)
	host := w.cfg.Hosts[rand.N(len(w.cfg.Hosts))]
	op := Op{Kind: "call", Worker: w.id, Gateway: w.gw, Era: w.era, Tag: tag, Host: host, Start: time.Now()}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.CallTimeout)
	params := &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": host, "command": "echo " + tag},
		Meta: mcp.Meta{"execution_id": tag}}
	res, err := w.cs.CallTool(cctx, params)
	cancel()
	op.End = time.Now()
	op.Outcome, op.Err = Classify(res, err, tag)
	w.h.add(op)
	if op.Outcome == Failed {
		// The gateway may be gone: a new session, on the next gateway.
		_ = w.cs.Close()
		w.cs = nil
		w.gw = (w.gw + 1) % len(w.cfg.Gateways)
	}
}

// Classify reads what the client of a call whose command was echo TAG
// got.
func Classify(res *mcp.CallToolResult, err error, tag string) (Outcome, string) {
	if err != nil {
		return Failed, err.Error()
	}
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	text := b.String()
	switch {
	case !res.IsError && strings.Contains(text, tag):
		return OK, ""
	case !res.IsError:
		return ToolError, "answered without the tag: " + protocol.Ellipsis(text, 300)
	case strings.Contains(text, "was not run: the gateway cannot record it"):
		return Refused, protocol.Ellipsis(text, 300)
	case strings.Contains(text, "so its result is withheld"):
		return Withheld, protocol.Ellipsis(text, 300)
	}
	return ToolError, protocol.Ellipsis(text, 300)
}

// enrolLoop enrols a new host every EnrolEvery, through the replicas in
// turn.
func enrolLoop(ctx context.Context, cfg *Config, h *History) {
	every := cfg.EnrolEvery
	if every == 0 {
		every = 200 * time.Millisecond
	}
	for n := 0; ctx.Err() == nil; n++ {
		gw := n % len(cfg.Gateways)
		host := fmt.Sprintf("%s-e%d", cfg.RunID, n)
		op := Op{Kind: "enrol", Gateway: gw, Tag: host, Host: host, Start: time.Now()}
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.CallTimeout)
		err := cfg.Enrol(ectx, gw, host)
		cancel()
		op.End = time.Now()
		op.Outcome = OK
		if err != nil {
			op.Outcome, op.Err = Failed, err.Error()
			var refused interface{ Refused() bool }
			if errors.As(err, &refused) && refused.Refused() {
				op.Outcome = ToolError
			}
		}
		h.add(op)
		select {
		case <-ctx.Done():
		case <-time.After(every):
		}
	}
}
