package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Agent is one machine's member of the fleet.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	tools   map[string]toolFunc
	started time.Time

	nc atomic.Pointer[nats.Conn] // current connection; nil while dialling

	calls *callTable
	pend  assembler

	// workCtx is the parent of every call's context; it is cancelled only
	// when a drain times out.
	workCtx context.Context
	queueMu sync.Mutex // guards sending on and closing queue
	queue   chan *job
	// draining is set once shutdown begins: new calls are refused.
	draining atomic.Bool
}

// New validates cfg and returns an Agent ready to Run.
func New(cfg Config) (*Agent, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	tb, err := newToolbox(toolboxConfig{
		Cwd:                cfg.Cwd,
		StateDir:           cfg.StateDir,
		Home:               cfg.Home,
		Shell:              cfg.Shell,
		BashDefaultTimeout: cfg.BashDefaultTimeout,
		BashMaxTimeout:     cfg.BashMaxTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	return &Agent{
		cfg:   cfg,
		log:   cfg.Logger.With("host", cfg.Name),
		tools: tb.tools(),
		calls: newCallTable(cfg.ResultTTL),
		pend:  assembler{calls: make(map[string]*pending)},
		queue: make(chan *job, cfg.MaxQueue),
	}, nil
}

// Name returns the host ID the agent serves.
func (a *Agent) Name() string { return a.cfg.Name }

// Run connects to NATS and serves calls until ctx is cancelled. Then it
// drains: it refuses new calls, lets in-flight ones finish (at most
// DrainTimeout, then cancels them), announces that it is leaving and
// closes the connection. Run re-dials forever, with jittered backoff,
// whatever NATS answers; it returns only after ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	a.started = time.Now()
	a.log.Info("agent starting", "nats", a.cfg.Servers, "cwd", a.cfg.Cwd, "shell", a.cfg.Shell,
		"state_dir", a.cfg.StateDir, "max_concurrent", a.cfg.MaxConcurrent, "max_queue", a.cfg.MaxQueue)

	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	a.workCtx = workCtx
	var workers sync.WaitGroup
	for range a.cfg.MaxConcurrent {
		workers.Go(func() { a.worker(workCtx) })
	}

	sessionsDone := make(chan struct{})
	go func() {
		defer close(sessionsDone)
		a.dialLoop(ctx)
	}()
	// Keepalives run until the drain is over, so calls that finish during
	// shutdown are not mistaken for a dead host.
	keepDone := make(chan struct{})
	stopKeep := make(chan struct{})
	go func() {
		defer close(keepDone)
		a.keepaliveLoop(stopKeep)
	}()

	<-ctx.Done()
	a.log.Info("agent draining", "running", a.calls.running(), "timeout", a.cfg.DrainTimeout)
	a.stopQueue() // workers finish queued jobs, then exit
	drained := make(chan struct{})
	go func() { workers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(a.cfg.DrainTimeout):
		a.log.Warn("drain timeout: cancelling calls still running", "running", a.calls.running())
		cancelWork()
		<-drained
	}
	close(stopKeep)
	<-keepDone
	<-sessionsDone
	if nc := a.nc.Load(); nc != nil {
		a.announce(nc, true)
		_ = nc.Flush()
		nc.Close()
	}
	a.log.Info("agent stopped")
	return nil
}

// dialLoop keeps one NATS session alive until ctx ends. nats.go reconnects
// by itself, but gives up for good after repeated authentication errors, so
// a closed connection is re-dialled here with jittered backoff.
func (a *Agent) dialLoop(ctx context.Context) {
	backoff := a.cfg.ReconnectMin
	for ctx.Err() == nil {
		closed := make(chan struct{})
		nc, err := a.connect(closed)
		if err != nil {
			wait := backoff/2 + rand.N(backoff/2+1)
			a.log.Warn("cannot reach NATS; retrying", "err", err, "in", wait.Round(time.Millisecond))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			backoff = min(backoff*2, a.cfg.ReconnectMax)
			continue
		}
		backoff = a.cfg.ReconnectMin
		a.serve(ctx, nc, closed)
	}
}

func (a *Agent) connect(closed chan struct{}) (*nats.Conn, error) {
	opts := []nats.Option{
		nats.Name("fleet-agent " + a.cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(a.cfg.ReconnectMin),
		nats.ReconnectJitter(a.cfg.ReconnectMin, a.cfg.ReconnectMin),
		nats.PingInterval(10 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.CustomInboxPrefix(protocol.AgentInboxPrefix(a.cfg.Name)),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				a.log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			a.log.Info("NATS reconnected", "url", nc.ConnectedUrlRedacted())
			a.announce(nc, false)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			a.log.Warn("NATS error", "err", err)
		}),
	}
	if a.cfg.User != "" {
		opts = append(opts, nats.UserInfo(a.cfg.User, a.cfg.Password))
	}
	opts = append(opts, a.cfg.NATSOptions...)
	return nats.Connect(joinURLs(a.cfg.Servers), opts...)
}

// serve subscribes to the host's subjects on nc, announces the host and
// heartbeats until ctx ends or the connection closes for good.
func (a *Agent) serve(ctx context.Context, nc *nats.Conn, closed <-chan struct{}) {
	var subs []*nats.Subscription
	sub := func(subject string, h nats.MsgHandler) error {
		s, err := nc.Subscribe(subject, h)
		if err == nil {
			// Bursts of output frames from the gateway are small; the
			// defaults (64k messages, 64 MiB) bound memory.
			subs = append(subs, s)
		}
		return err
	}
	err := errors.Join(
		sub(protocol.CallSubject(a.cfg.Name), a.onCall),
		sub(protocol.CancelSubject(a.cfg.Name), a.onCancel),
		sub(protocol.FetchSubject(a.cfg.Name), a.onFetch),
		sub(protocol.DiscoverSubject(), func(*nats.Msg) {
			time.AfterFunc(rand.N(200*time.Millisecond), func() { a.announce(nc, false) })
		}),
	)
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		a.log.Error("subscribe failed; re-dialling", "err", err)
		nc.Close()
		return
	}
	a.nc.Store(nc)
	a.log.Info("joined fleet", "url", nc.ConnectedUrlRedacted())
	a.announce(nc, false)

	tick := time.NewTicker(a.cfg.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return
		case <-closed:
			a.log.Warn("NATS connection closed; re-dialling")
			return
		case <-tick.C:
			a.announce(nc, false)
		}
	}
}

func (a *Agent) keepaliveLoop(stop <-chan struct{}) {
	t := time.NewTicker(a.cfg.Keepalive)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			a.keepalive()
			a.calls.prune(now)
			a.prunePending(now)
		}
	}
}

func (a *Agent) announce(nc *nats.Conn, leaving bool) {
	host, _ := os.Hostname()
	tools := make([]string, 0, len(a.tools))
	for name := range a.tools {
		tools = append(tools, name)
	}
	slices.Sort(tools)
	msg := protocol.Announce{
		Host:         a.cfg.Name,
		Protocol:     protocol.Version,
		AgentVersion: Version,
		Labels:       a.cfg.Labels,
		OS:           runtime.GOOS,
		Arch:         runtime.GOARCH,
		Hostname:     host,
		Cwd:          a.cfg.Cwd,
		Shell:        a.cfg.Shell,
		Tools:        tools,
		StartedAt:    a.started,
		HeartbeatMS:  a.cfg.Heartbeat.Milliseconds(),
		Leaving:      leaving,
		Busy:         a.calls.running(),
		Limit:        a.cfg.MaxConcurrent,
	}
	data, err := json.Marshal(msg)
	if err != nil {
		a.log.Error("encode announce", "err", err)
		return
	}
	if err := nc.Publish(protocol.PresenceSubject(a.cfg.Name), data); err != nil {
		a.log.Warn("announce failed", "err", err)
	}
}

func joinURLs(urls []string) string {
	s := ""
	for i, u := range urls {
		if i > 0 {
			s += ","
		}
		s += u
	}
	return s
}
