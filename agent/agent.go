package agent

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/agent/callauth"
	"github.com/fleetmcp/fleetmcp/agent/tasks"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Agent is one machine's member of the fleet.
type Agent struct {
	cfg Config
	log *slog.Logger
	// hp is the host policy in force and the tools it lets the host
	// serve; Reload swaps it. allTools are the toolbox's tools, guard
	// the checks the tools make with the policy, policyEnv what the
	// policy is read for.
	hp        atomic.Pointer[hostPolicy]
	allTools  map[string]toolFunc
	guard     *guard
	policyEnv policy.Env
	reloadMu  sync.Mutex
	// gitGuard runs git for bash under command rules (nil otherwise);
	// Reload gives it the new policy's deny rules.
	gitGuard *gitGuard
	// skills is the host's skill catalog as the policy lets callers see it.
	skills *catalog
	// skillSync installs the skills the fleet rolls out to the host.
	skillSync *skillSync
	// instance tells this process's announces from those of another
	// process using the same host name; agentID (from the state
	// directory) stays the same across restarts.
	instance string
	agentID  string
	// shell is what announces show as the host's shell ("bash",
	// "pwsh 7.4.6"), so that a model writes the right language.
	shell string
	// state is the state directory this agent holds from New until Run
	// returns (or Close).
	state   *stateDir
	started time.Time
	// cancelGrace is how long a drain waits for cancelled calls to stop.
	cancelGrace time.Duration

	nc atomic.Pointer[nats.Conn] // current connection; nil while dialling
	// skillsLeftOut is how many skills the last announce left out to fit.
	skillsLeftOut atomic.Int64
	// callSub is the current subscription to the host's calls.
	callSub atomic.Pointer[nats.Subscription]
	// discovering is set while an announce answering a discovery request
	// waits to go out: a flood of requests makes one announce at a time.
	discovering atomic.Bool

	calls *callTable
	pend  assembler
	// auth checks the envelopes of the messages the agent acts on, with
	// the gateway keys it trusts; receipts signs its receipts (nil:
	// the agent has no key); tb is the toolbox, which a call whose
	// caller the host policy narrows runs with its own policy.
	auth     *callauth.Verifier
	receipts *callauth.ReceiptSigner
	tb       *toolbox
	// reports and refusalLogs bound the reports and the log lines of
	// refused messages; keysJoined wakes the key loop on a (re)join.
	reports     reporter
	refusalLogs *logLimiter
	keysJoined  chan struct{}
	// tracing makes the spans of traced calls (nil: off).
	tracing *tracing
	// counts are the calls served, failed and refused (stats.go).
	counts callStats
	// tasks runs background tasks; they outlive the agent process.
	tasks *tasks.Manager

	// workCtx is the parent of every call's context; it is cancelled only
	// when a drain times out.
	workCtx context.Context
	queueMu sync.Mutex // guards sending on and closing queue
	queue   chan *job
	// slots holds one token per call admitted and not yet answered, at
	// most MaxConcurrent + MaxQueue: a call gives its token back before
	// its result goes out, so a caller that sends its next call on the
	// answer is never refused as busy by the call it just saw end (a
	// worker is a moment longer on its way back to the queue, which has
	// room for every token).
	slots chan struct{}
	// afterRun, when set (by tests), is called by a worker after each
	// call it ran, before it takes the next.
	afterRun func()
	// draining is set once shutdown begins: new calls are refused.
	draining atomic.Bool
	// lastDialFailure is the reason the last connection attempt failed
	// (owned by dialLoop).
	lastDialFailure string
	// recoverState is the credential state a recovery was last asked for
	// in ("": none since the last connection), at recoverAsked (owned by
	// dialLoop).
	recoverState string
	recoverAsked time.Time
	// joined wakes the renewal loop when the agent (re)joins; renewRetry
	// is the first wait after a failed renewal.
	joined     chan struct{}
	renewRetry time.Duration

	// servers are the NATS URLs dialled now: Config.Servers, or those
	// the gateway gave since (reach.go).
	servers atomic.Pointer[[]string]
	// reach bounds the warnings about NATS being out of reach; lastDial
	// is the last failed dial (reach.go).
	reach    reachLog
	lastDial lastDial
	// fatal carries the reason the agent must stop (a *RevokedError);
	// locatePoke wakes the locate loop, redial cuts dialLoop's wait.
	fatal      chan error
	stopping   atomic.Bool // set with the first reason on fatal
	locatePoke chan struct{}
	redial     chan struct{}
}

// New validates cfg, takes the state directory for this process (a
// *StateDirInUseError when another agent holds it), or the lock of
// cfg.StateLock, and returns an Agent ready to Run.
func New(cfg Config) (a *Agent, err error) {
	if cfg.StateLock != nil {
		defer func() {
			if err != nil {
				cfg.StateLock.Release()
			}
		}()
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("agent config: %w", err)
	}
	env := policy.Env{OS: runtime.GOOS, FoldCase: onDarwin, Cwd: cfg.Cwd, Home: cfg.Home, Tools: toolNames(), Shell: cfg.Shell,
		GitGuarded: cfg.GitGuard != ""}
	pol, err := loadPolicy(cfg.PolicyFile, env)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("host", cfg.Name)
	// Nothing in the state directory is touched before it is ours: the
	// toolbox recovers interrupted patches and installs the git guard there.
	state, err := openStateDir(cfg.StateDir, cfg.StateLock)
	if err != nil {
		return nil, err
	}
	tb, err := newToolbox(cfg.toolbox(pol, log))
	if err != nil {
		state.close()
		return nil, fmt.Errorf("agent config: %w", err)
	}
	// Skills are read as the read tool reads files: through its guard.
	// What the fleet installed is recorded in the state directory, out of
	// the skills folder and of the commands' reach.
	installed := loadInstalled(cfg.StateDir, log)
	skills := newFleetCatalog(cfg.SkillsDir, cfg.FleetSkillsDir, installed, cfg.Name, tb.guard, log)
	tb.skills = skills
	all := tb.tools()
	a = &Agent{
		cfg:         cfg,
		log:         log,
		allTools:    all,
		guard:       tb.guard,
		gitGuard:    tb.gitGuard,
		policyEnv:   env,
		skills:      skills,
		instance:    newInstanceID(),
		cancelGrace: 5 * time.Second,
		joined:      make(chan struct{}, 1),
		fatal:       make(chan error, 1),
		locatePoke:  make(chan struct{}, 1),
		redial:      make(chan struct{}, 1),
		renewRetry:  renewRetryMin,
		calls:       newCallTable(cfg.ResultTTL, log),
		pend:        assembler{calls: make(map[string]*pending), decoding: make(map[string]*pending)},
		tracing:     newTracing(cfg.TracerProvider),
		queue:       make(chan *job, cfg.MaxConcurrent+cfg.MaxQueue),
		slots:       make(chan struct{}, cfg.MaxConcurrent+cfg.MaxQueue),
		tasks:       tb.tasks,
		state:       state,
		agentID:     state.agentID,
		tb:          tb,
		refusalLogs: newLogLimiter(time.Minute, 5),
		keysJoined:  make(chan struct{}, 1),
		shell:       describeShell(context.Background(), tb.shell),
	}
	a.hp.Store(newHostPolicy(all, pol))
	servers := slices.Clone(cfg.Servers)
	a.servers.Store(&servers)
	if a.auth, err = callauth.New(callauth.Config{Host: cfg.Name, Instance: a.instance, Keys: protocol.KeyState{Serial: cfg.GatewayKeySerial, Keys: cfg.GatewayKeys}}); err != nil {
		state.close()
		return nil, fmt.Errorf("agent config: %w", err)
	}
	if len(cfg.Credentials.Seed) > 0 {
		if a.receipts, err = callauth.NewReceiptSigner(cfg.Credentials.Seed); err != nil {
			state.close()
			return nil, fmt.Errorf("agent config: %w", err)
		}
	}
	a.skillSync = newSkillSync(cfg.Name, func() []string { return a.auth.Keys().Keys }, func() *policy.Policy { return a.served().pol }, cfg.FleetSkillsDir, cfg.SkillsDir, cfg.StateDir, installed, log,
		func() { skills.refresh(a.skillsChanged) })
	skills.onTampered = a.skillSync.noteTampered
	return a, nil
}

// toolbox is the configuration of the tools an agent with cfg and the
// host policy pol serves.
func (cfg *Config) toolbox(pol *policy.Policy, log *slog.Logger) toolboxConfig {
	return toolboxConfig{
		Cwd:                cfg.Cwd,
		StateDir:           cfg.StateDir,
		FleetSkills:        cfg.FleetSkillsDir,
		Home:               cfg.Home,
		Shell:              cfg.Shell,
		GitGuard:           cfg.GitGuard,
		TaskWrapper:        cfg.TaskWrapper,
		ConfineCommands:    cfg.ConfineCommands,
		ConfineHelper:      cfg.ConfineHelper,
		SkillsDir:          cfg.SkillsDir,
		BashDefaultTimeout: cfg.BashDefaultTimeout,
		BashMaxTimeout:     cfg.BashMaxTimeout,
		BashMaxLines:       cfg.BashMaxLines,
		BashMaxBytes:       cfg.BashMaxBytes,
		Policy:             pol,
		PolicyFile:         cfg.PolicyFile,
		SecretFiles:        cfg.SecretFiles,
		ProtectedPaths:     cfg.ProtectedPaths,
		ImageMaxDimension:  cfg.ImageMaxDimension,
		ImageMaxBytes:      cfg.ImageMaxBytes,
		BinaryMaxBytes:     cfg.BinaryMaxBytes,
		SpillMaxBytes:      cfg.OutputFileMaxBytes,
		SpillMaxAge:        cfg.OutputRetention,
		SpillMaxFiles:      cfg.MaxOutputFiles,
		SpillMaxTotal:      cfg.OutputFilesMaxBytes,
		// Commands inherit the process environment minus the agent's
		// own variables; the agent's settings never come from it.
		ChildEnv: os.Environ(),
		Host:     cfg.Name,
		Tasks: tasks.Config{
			DefaultTimeout: cfg.TaskDefaultTimeout,
			MaxTimeout:     cfg.TaskMaxTimeout,
			MaxRunning:     cfg.MaxRunningTasks,
			MaxQueued:      cfg.MaxQueuedTasks,
			Retention:      cfg.TaskRetention,
			MaxKept:        cfg.MaxKeptTasks,
			MaxKeptBytes:   cfg.MaxKeptTaskOutput,
			MaxOutputBytes: cfg.MaxTaskOutput,
			TailBytes:      cfg.TaskTailBytes,
			// A waiting task_status holds a worker: at most half of them.
			MaxWaits: max(1, cfg.MaxConcurrent/2),
		},
		Logger: log,
	}
}

// Close releases the state directory of an agent that will not Run. Run
// releases it itself when it returns.
func (a *Agent) Close() { a.state.close() }

// hostPolicy is a host policy and what follows from it.
type hostPolicy struct {
	pol   *policy.Policy      // nil: unrestricted
	tools map[string]toolFunc // the tools the host serves
	// refused holds the tools the policy refuses, so that calls to them
	// are told why.
	refused map[string]bool
}

func newHostPolicy(all map[string]toolFunc, pol *policy.Policy) *hostPolicy {
	tools, refused := servedTools(all, pol)
	return &hostPolicy{pol: pol, tools: tools, refused: refused}
}

// served returns the host policy in force.
func (a *Agent) served() *hostPolicy { return a.hp.Load() }

// servedTools splits tools into those pol lets the host serve and the
// names of those it refuses. The task tools come with bash.
func servedTools(tools map[string]toolFunc, pol *policy.Policy) (map[string]toolFunc, map[string]bool) {
	served, refused := make(map[string]toolFunc), make(map[string]bool)
	for name, f := range tools {
		decides := name
		if slices.Contains(taskToolNames(), name) {
			decides = "bash"
		}
		if pol.AllowTool(decides) != nil {
			refused[name] = true
		} else {
			served[name] = f
		}
	}
	return served, refused
}

func (hp *hostPolicy) toolList() []string {
	return slices.Sorted(maps.Keys(hp.tools))
}

// onDiscover answers a gateway's discovery request with an announce
// after a random delay (a fleet answering at once would burst), one at a
// time: requests that come while one waits are answered by it. Discovery
// requests are not signed (they make the agent do what it does every few
// seconds anyway), so anyone may send many.
func (a *Agent) onDiscover(nc *nats.Conn) {
	if !a.discovering.CompareAndSwap(false, true) {
		return
	}
	time.AfterFunc(rand.N(200*time.Millisecond), func() {
		a.discovering.Store(false)
		a.announce(nc, false)
	})
}

// newInstanceID returns a random ID for this process.
func newInstanceID() string {
	b := make([]byte, 8)
	_, _ = crand.Read(b) // never fails: it crashes the program instead
	return hex.EncodeToString(b)
}

// Run connects to NATS and serves calls until ctx is cancelled. Then it
// drains: it refuses new calls, lets in-flight ones finish (at most
// DrainTimeout, then cancels them), announces that it is leaving and
// closes the connection. While it drains it still answers cancels and
// fetches. Run re-dials forever, with jittered backoff, whatever NATS
// answers; it returns only after ctx ends, or with an error: at once when
// the background tasks directory cannot be used, and, after draining, when
// NATS refuses the host its own subjects on its first connection (a
// *JoinRefusedError: the credential is another host's), or when the
// host was revoked (a *RevokedError: NATS closed its connection as
// revoked, or the gateway refused a recovery, renewal or URL request so).
func (a *Agent) Run(ctx context.Context) error {
	a.started = time.Now()
	defer a.state.close()
	a.log.Info("agent starting", "nats", a.cfg.Servers, "cwd", a.cfg.Cwd, "shell", a.cfg.Shell,
		"state_dir", a.cfg.StateDir, "skills_dir", a.cfg.SkillsDir, "max_concurrent", a.cfg.MaxConcurrent, "max_queue", a.cfg.MaxQueue,
		"instance", a.instance, "agent_id", a.agentID, "gateway_keys", a.auth.KeyIDs())
	if len(a.auth.KeyIDs()) == 0 {
		a.log.Error("this host knows no gateway signing key (it was enrolled before calls were signed), so it runs no call: enrol it again with fleet-agent join")
	}
	a.logPolicy()
	a.logConfinement()
	// Background tasks a previous agent left are taken over before any
	// call is heard; they keep running when this agent stops.
	if err := a.tasks.Open(); err != nil {
		return fmt.Errorf("background tasks: %w", err)
	}
	defer a.tasks.Close()

	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	a.workCtx = workCtx
	var workers sync.WaitGroup
	for range a.cfg.MaxConcurrent {
		workers.Go(a.worker)
	}

	// The NATS session and the keepalives last until the drain is over:
	// meanwhile cancels and fetches are still heard, new calls are
	// refused rather than left unanswered, and calls that finish during
	// shutdown are not mistaken for a dead host.
	sessCtx, endSession := context.WithCancel(context.WithoutCancel(ctx))
	defer endSession()
	// runCtx ends with ctx, or when the agent cannot join at all.
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	refused := make(chan error, 1)
	var session sync.WaitGroup
	session.Go(func() { a.dialLoop(sessCtx, refused) })
	session.Go(func() { a.keepaliveLoop(sessCtx) })
	session.Go(func() { a.keysLoop(runCtx) })
	if a.cfg.Renewer != nil {
		session.Go(func() { a.renewLoop(runCtx) })
	}
	if a.cfg.Locator != nil {
		session.Go(func() { a.locateLoop(runCtx) })
	}
	var watcher sync.WaitGroup
	watcher.Go(func() { a.skills.watch(runCtx, a.skillsChanged) })
	watcher.Go(func() { a.skillSync.run(runCtx, a.nc.Load) })

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-refused:
	case runErr = <-a.fatal:
	}
	stopRun()
	watcher.Wait()       // no announce of a changed catalog follows the leaving one
	a.tasks.BeginClose() // task_status waits end now, not at the drain timeout
	a.drain(&workers, cancelWork)
	endSession()
	session.Wait()
	a.leave()
	a.log.Info("agent stopped")
	return runErr
}

// leaveTimeout bounds how long the leaving announce may take to reach
// NATS.
const leaveTimeout = time.Second

// leave announces that the host is leaving, if NATS is connected (a
// disconnected agent does not wait for it), and closes the connection.
func (a *Agent) leave() {
	nc := a.nc.Load()
	if nc == nil {
		return
	}
	if nc.IsConnected() {
		a.announce(nc, true)
		_ = nc.FlushTimeout(leaveTimeout)
	}
	nc.Close()
}

// logPolicy logs the host policy: its file and digest, then one line per
// dimension.
func (a *Agent) logPolicy() {
	hp := a.served()
	switch {
	case a.cfg.PolicyFile == "":
		a.log.Info("host policy: none given (--policy); the host is unrestricted")
	case hp.pol.Unrestricted():
		a.log.Info("host policy: the file has no rules; the host is unrestricted", "file", a.cfg.PolicyFile)
	default:
		a.log.Info("host policy", "file", a.cfg.PolicyFile, "digest", hp.pol.Digest(), "tools", strings.Join(hp.toolList(), ","))
	}
	for _, line := range hp.pol.Summary() {
		a.log.Info("host policy: " + line)
	}
	switch {
	case hp.pol.GitRules() == nil:
	case hp.pol.GitGuarded():
		a.log.Info("host policy: git runs through the agent's git guard, which refuses configuration that could run programs")
	default:
		a.log.Warn("host policy: git is refused: this agent has no executable to run its git guard")
	}
}

// drain refuses new calls and waits for the calls accepted so far: at
// most DrainTimeout, then it cancels them and waits cancelGrace more.
// Calls that do not stop even then are reported and left behind.
func (a *Agent) drain(workers *sync.WaitGroup, cancelWork context.CancelFunc) {
	a.log.Info("agent draining", "running", a.calls.running(), "timeout", a.cfg.DrainTimeout)
	a.stopQueue() // workers finish queued jobs, then exit
	drained := make(chan struct{})
	go func() { workers.Wait(); close(drained) }()
	timer := time.NewTimer(a.cfg.DrainTimeout)
	defer timer.Stop()
	select {
	case <-drained:
		return
	case <-timer.C:
	}
	a.log.Warn("drain timeout: cancelling calls still running", "running", a.calls.running())
	cancelWork()
	timer.Reset(a.cancelGrace)
	select {
	case <-drained:
	case <-timer.C:
		a.abandonStuck(a.calls.snapshot())
	}
}

// abandonStuck reports calls that did not stop when cancelled and gives
// their callers a final answer, so that nobody waits for a host that is
// leaving.
func (a *Agent) abandonStuck(jobs []*job) {
	a.log.Warn("leaving with calls that did not stop when cancelled", "calls", len(jobs), "grace", a.cancelGrace)
	for _, j := range jobs {
		a.log.Warn("call did not stop when cancelled", "tool", j.call.Tool, "call", j.call.ID, "caller", j.call.Caller.Subject)
		res := protocol.ErrorResult(j.call.ID, protocol.CodeCancelled, fmt.Sprintf(
			"host %s shut down: %s call %s was cancelled and did not stop within %s; its outcome is unknown",
			a.cfg.Name, j.call.Tool, j.call.ID, a.cancelGrace))
		data, _ := protocol.EncodeResult(res)
		a.publishResult(j.reply, j.call.ID, data, a.receipt(res, data, j.start, time.Now(), nil), &j.seq)
	}
}

// serve joins the fleet on nc (see join), then heartbeats until ctx ends
// or the connection closes for good. When ctx ends it unsubscribes and
// leaves nc open for the leaving announce. It returns the reason it could
// not join, having closed nc.
func (a *Agent) serve(ctx context.Context, nc *nats.Conn, closed <-chan struct{}) error {
	subs, err := a.join(nc)
	if err != nil {
		nc.Close()
		return err
	}
	a.log.Info("joined fleet", "url", nc.ConnectedUrlRedacted())

	tick := time.NewTicker(a.cfg.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return nil
		case <-closed:
			a.nc.CompareAndSwap(nc, nil)
			a.log.Warn("NATS connection closed; re-dialling")
			return nil
		case <-tick.C:
			a.announce(nc, false)
		}
	}
}

// join subscribes to the host's subjects on nc, makes nc the agent's
// connection and announces the host.
// NATS reports a permissions violation asynchronously; join waits for the
// server to have processed each step (a flush) and fails with a
// *JoinRefusedError if it refused it. The host is announced only once
// its subscriptions are in place.
func (a *Agent) join(nc *nats.Conn) ([]*nats.Subscription, error) {
	var subs []*nats.Subscription
	sub := func(subject string, h nats.MsgHandler) error {
		s, err := nc.Subscribe(subject, h)
		if err == nil {
			// Cancels, fetches and discover requests are small; the
			// defaults (64k messages, 64 MiB) bound memory.
			subs = append(subs, s)
		}
		return err
	}
	callSub, err := nc.Subscribe(protocol.CallSubject(a.cfg.Name), a.onCall)
	if err == nil {
		// A gateway may send two calls of the largest size at once; their
		// parts wait here while an earlier call is decoded.
		err = callSub.SetPendingLimits(nats.DefaultSubPendingMsgsLimit, 2*int(a.cfg.MaxRequestBytes)+1<<20)
		subs = append(subs, callSub)
		a.callSub.Store(callSub)
	}
	err = errors.Join(err,
		sub(protocol.CancelSubject(a.cfg.Name), a.onCancel),
		sub(protocol.FetchSubject(a.cfg.Name), a.onFetch),
		sub(protocol.DiscoverSubject(), func(*nats.Msg) { a.onDiscover(nc) }),
		sub(protocol.SkillsPokeSubject(a.cfg.Name), a.onPoke),
		sub(protocol.KeysPushSubject(a.cfg.Name), a.onKeys),
	)
	if err == nil {
		err = a.checkAccepted(nc)
	}
	if err == nil {
		// Calls may arrive as soon as the host is announced, and their
		// answers go out on the agent's current connection: it must be
		// this one before the announce leaves.
		a.nc.Store(nc)
		a.announce(nc, false)
		if err = a.checkAccepted(nc); err != nil {
			a.nc.CompareAndSwap(nc, nil)
		} else {
			a.skillSync.poke() // read the desired skills, report status
		}
	}
	if err != nil {
		return nil, fmt.Errorf("join the fleet: %w", err)
	}
	a.signalJoined()
	a.signalKeys()
	return subs, nil
}

// checkAccepted flushes nc and returns a *JoinRefusedError if the server
// refused anything sent on it so far.
func (a *Agent) checkAccepted(nc *nats.Conn) error {
	if err := nc.Flush(); err != nil {
		return err
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
		return &JoinRefusedError{Host: a.cfg.Name, User: a.cfg.Credentials.credentialName(), Err: err}
	}
	return nil
}

// JoinRefusedError reports that NATS refused the host its own subjects:
// the agent's credential does not give it them.
type JoinRefusedError struct {
	Host string
	// User is the NATS user name of the agent's credential ("" when it
	// has none).
	User string
	Err  error // the server's permissions violation
}

func (e *JoinRefusedError) Error() string {
	if e.User == "" {
		return fmt.Sprintf("NATS refused host %q its own subjects (%v): the agent connected without a credential of its own; enrol it with the gateway (fleet-agent join)",
			e.Host, e.Err)
	}
	return fmt.Sprintf("NATS refused host %q its own subjects (%v), though its credential is for NATS user %q: "+
		"the servers' agent permissions are not the fleet's; on an external cluster, check the template of the fleet account's agent signing key (deploy/nats/README.md)",
		e.Host, e.Err, e.User)
}

func (e *JoinRefusedError) Unwrap() error { return e.Err }

func (a *Agent) keepaliveLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.Keepalive)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
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
	hp := a.served()
	msg := protocol.Announce{
		Host:         a.cfg.Name,
		Instance:     a.instance,
		AgentID:      a.agentID,
		Protocol:     protocol.Version,
		AgentVersion: Version,
		OS:           runtime.GOOS,
		Arch:         runtime.GOARCH,
		Hostname:     host,
		Cwd:          a.cfg.Cwd,
		Shell:        a.shell,
		Tools:        hp.toolList(),
		PolicyDigest: hp.pol.Digest(),
		Confinement:  a.tb.jail.state,
		TrustedKeys:  a.auth.KeyIDs(),
		StartedAt:    a.started,
		HeartbeatMS:  a.cfg.Heartbeat.Milliseconds(),
		Leaving:      leaving,
		Skills:       a.skills.list(),
		Busy:         a.calls.running(),
		Limit:        a.cfg.MaxConcurrent,
		Stats:        a.stats(),
	}
	data, dropped, err := fitAnnounce(&msg, min(protocol.MaxAnnounceBytes, int(nc.MaxPayload())))
	if err != nil {
		a.log.Error("encode announce", "err", err)
		return
	}
	if prev := a.skillsLeftOut.Swap(int64(dropped)); prev != int64(dropped) && dropped > 0 {
		a.log.Warn("skills: the catalog is too large for one announce; the last skills by name are not announced",
			"left_out", dropped, "announced", len(msg.Skills), "max_bytes", min(protocol.MaxAnnounceBytes, int(nc.MaxPayload())))
	}
	if err := nc.Publish(protocol.PresenceSubject(a.cfg.Name), data); err != nil {
		a.log.Warn("announce failed", "err", err)
	}
}

// fitAnnounce encodes msg, leaving out as few of its last skills as it
// must for the encoding to fit in limit bytes; it returns how many it left
// out. Everything else in an announce is bounded at start (Config
// validation), so the skill catalog is all that can be too large.
func fitAnnounce(msg *protocol.Announce, limit int) (data []byte, dropped int, err error) {
	all := msg.Skills
	encode := func(n int) ([]byte, error) {
		msg.Skills = all[:n]
		return json.Marshal(msg)
	}
	if data, err = encode(len(all)); err != nil || len(data) <= limit {
		return data, 0, err
	}
	// The largest n whose encoding fits: fits(0) is assumed, fits(len)
	// is known false.
	lo, hi := 0, len(all)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if d, err := encode(mid); err != nil {
			return nil, 0, err
		} else if len(d) <= limit {
			lo = mid
		} else {
			hi = mid
		}
	}
	data, err = encode(lo)
	return data, len(all) - lo, err
}

// skillsChanged announces the host at once when its skill catalog
// changes, so that the gateway need not wait for the next heartbeat.
func (a *Agent) skillsChanged() {
	if nc := a.nc.Load(); nc != nil {
		a.announce(nc, false)
	}
}

// reasonOf is dialFailure's reason alone.
func reasonOf(err error) string {
	r, _ := dialFailure(err)
	return r
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
