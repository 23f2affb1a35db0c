package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/loglimit"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
)

// HostError is a failure to reach a host or to hear back from it. Its
// message names the host and says what to do.
type HostError struct {
	Host string
	Kind HostErrorKind
	Msg  string
}

// HostErrorKind classifies a HostError.
type HostErrorKind int

const (
	HostUnknown HostErrorKind = iota + 1
	HostOffline
	HostSilent
	HostTimeout
	HostUnreachable
	HostConflict
	// HostGone: nobody listens on the host's subjects (its agent is not
	// connected), though the registry had not noticed yet.
	HostGone
	// HostBusy: the gateway had no room for the call's large result
	// (its transfer budget).
	HostBusy
	// HostRevoked: the host's agent was revoked.
	HostRevoked
	// HostUntrusted: the host cannot check the gateway's signatures
	// (no keys, an older agent, or not the gateway's current ones), so
	// nothing is sent to it.
	HostUntrusted
	// HostRefused: the host refused the call's signed envelope
	// (callsign.go), or its answer carried no valid receipt.
	HostRefused
)

func (e *HostError) Error() string { return e.Msg }

// router sends calls to agents and collects their streamed replies. All
// replies arrive on one wildcard inbox subscription, on one subject per
// host, and are handed to the waiting call by the call ID every frame
// carries, so a call costs no subscribe round trip, and the NATS server
// keeps per agent one reply permission and one routing cache entry
// however many calls it answers.
type router struct {
	nc      *nats.Conn
	reg     *registry
	log     *slog.Logger
	silence time.Duration

	inbox string
	sub   *nats.Subscription
	// badFrames limits the lines logged about malformed reply frames:
	// an agent may publish any number to its reply subject.
	badFrames *loglimit.Limiter
	// transfers is the budget large results take their size from (nil:
	// none).
	transfers *transfers
	// keys signs the envelopes of the messages to agents; hostKey finds
	// the key enrolled for a host, which its receipts must be signed
	// with (callsign.go).
	keys    *signing.Keys
	hostKey func(host string) (string, bool)
	// refusedSub hears the agents' reports of refused messages
	// (refusals.go); bounds limits them per host, and refusalRecords
	// takes the records they make to the audit writer.
	refusedSub     *nats.Subscription
	bounds         *hostBounds
	refusalRecords chan *audit.Record
	// tracing makes a span of each call (nil: off).
	tracing *tracing

	mu     sync.Mutex
	calls  map[string]*inflight            // by call ID
	byHost map[string]map[string]*inflight // by host, then call ID
	recent recentCalls                     // finished lately
}

// inflight buffers the frames of one call between the NATS callback (which
// must never block) and the goroutine waiting for the call.
type inflight struct {
	host string
	// sent is the gateway's record of the call, for the reports about
	// it (refusals.go).
	sent   *sentCall
	mu     sync.Mutex
	frames []protocol.Frame
	// pendingBytes counts the data of the output, progress and keepalive
	// frames buffered, pendingResult that of the result frames.
	pendingBytes, pendingResult int
	dropped                     int
	noResponders                bool
	// discard drops result frames while the waiter waits for room to
	// take a large result in (waiter.reserve).
	discard bool
	// refused is the host's report that it refused the call (nil:
	// none).
	refused *protocol.Refusal
	notify  chan struct{}
}

func (fl *inflight) discardResults(on bool) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	fl.discard = on
	if on {
		fl.frames = slices.DeleteFunc(fl.frames, func(f protocol.Frame) bool { return f.Kind == protocol.KindResult })
		fl.pendingResult = 0
	}
}

// A waiter may be slow (its client reads progress notifications slowly),
// and an agent may send without end, so what is buffered per call is
// bounded: output, progress and keepalive frames beyond maxPendingOutput
// bytes or maxPendingFrames frames are dropped, as they may be; result
// frames beyond protocol.MaxResultBytes are dropped too, which makes the
// result incomplete, and the waiter fetches it again (a correct agent
// sends one result, within that limit).
const (
	maxPendingOutput = 8 << 20
	maxPendingFrames = 4096
)

func newRouter(nc *nats.Conn, reg *registry, log *slog.Logger, silence time.Duration, budget *transfers, tr *tracing,
	keys *signing.Keys, hostKey func(string) (string, bool), bounds *hostBounds, reports *nats.Conn) (*router, error) {
	r := &router{
		nc: nc, reg: reg, log: log, silence: silence, badFrames: loglimit.New(logEvery, 1), transfers: budget, tracing: tr,
		keys: keys, hostKey: hostKey, bounds: bounds, refusalRecords: make(chan *audit.Record, refusalQueue),
		inbox:  protocol.GatewayInboxPrefix() + "." + nats.NewInbox()[len(nats.InboxPrefix):],
		calls:  make(map[string]*inflight),
		byHost: make(map[string]map[string]*inflight),
	}
	sub, err := nc.Subscribe(protocol.ReplyWildcard(r.inbox), r.onReply)
	if err != nil {
		return nil, fmt.Errorf("subscribe reply inbox: %w", err)
	}
	// Replies are bounded per call above; give the subscription room for
	// bursts from many agents at once.
	if err := sub.SetPendingLimits(1<<20, 512<<20); err != nil {
		return nil, err
	}
	r.sub = sub
	// Hosts' refusal reports come on a connection of their own (nc when
	// none): a flood of them does not delay the replies above.
	if reports == nil {
		reports = nc
	}
	if r.refusedSub, err = reports.Subscribe(protocol.RefusedSubjectAll, r.onRefused); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe refusals: %w", err)
	}
	return r, nil
}

func (r *router) onReply(m *nats.Msg) {
	host := protocol.HostFromReply(m.Subject)
	if m.Header.Get("Status") == "503" && len(m.Data) == 0 {
		// Nobody listens on the host's subjects: every call to it that
		// has not heard from it yet fails (see waiter.wait).
		r.mu.Lock()
		fls := make([]*inflight, 0, len(r.byHost[host]))
		for _, fl := range r.byHost[host] {
			fls = append(fls, fl)
		}
		r.mu.Unlock()
		for _, fl := range fls {
			fl.mu.Lock()
			fl.noResponders = true
			fl.mu.Unlock()
			fl.wake()
		}
		return
	}
	f, err := protocol.DecodeFrame(protocol.Header(m.Header), m.Data)
	if err != nil {
		r.badFrames.Log(r.log, slog.LevelWarn, host, "dropping malformed reply frames", "host", protocol.Clip(host, protocol.MaxHostLen), "err", protocol.Clip(err.Error(), 300))
		return
	}
	r.mu.Lock()
	fl := r.calls[f.CallID]
	r.mu.Unlock()
	if fl == nil || fl.host != host {
		return // a late frame of a finished call, or not this host's call
	}
	fl.mu.Lock()
	if !fl.room(f) {
		fl.dropped++
		fl.mu.Unlock()
		return
	}
	fl.frames = append(fl.frames, f)
	fl.mu.Unlock()
	fl.wake()
}

// room reports whether f may be buffered, and counts it if so. The
// caller holds fl.mu.
func (fl *inflight) room(f protocol.Frame) bool {
	if f.Kind == protocol.KindResult {
		if fl.discard || fl.pendingResult+len(f.Data) > protocol.MaxResultBytes {
			return false
		}
		fl.pendingResult += len(f.Data)
		return true
	}
	if fl.pendingBytes+len(f.Data) > maxPendingOutput || len(fl.frames) >= maxPendingFrames {
		return false
	}
	fl.pendingBytes += len(f.Data)
	return true
}

func (fl *inflight) wake() {
	select {
	case fl.notify <- struct{}{}:
	default:
	}
}

func (fl *inflight) take() ([]protocol.Frame, bool, *protocol.Refusal) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	frames, nr, refused := fl.frames, fl.noResponders, fl.refused
	fl.frames, fl.noResponders, fl.pendingBytes, fl.pendingResult, fl.refused = nil, false, 0, 0, nil
	return frames, nr, refused
}

// resultWaiting reports whether result frames are buffered, not yet
// taken by the waiter.
func (fl *inflight) resultWaiting() bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.pendingResult > 0
}

// callRequest is one tool call to route.
type callRequest struct {
	// ID is the call's ID; empty: the router makes one.
	ID      string
	Host    string
	Tool    string
	Caller  protocol.Caller
	Args    json.RawMessage
	Timeout time.Duration // 0: none beyond the agent's own limits
	// Hold, when set, keeps what a large result takes of the transfer
	// budget until it is closed (once the response carrying the result
	// is written); otherwise, or once it is closed, the router gives it
	// back when the call returns.
	Hold *transferHold
	// Receipt, when set, receives the host's receipt of the result, as
	// checked (callsign.go), for the audit trail.
	Receipt *audit.Receipt
}

// frameFunc sees a call's output, progress and keepalive frames as they
// arrive, on the calling goroutine.
type frameFunc func(protocol.Frame)

// call routes req to its host and waits for the final result. Errors are
// *HostError for routing failures, or ctx's error when the caller gave up
// (the agent is then told to cancel the call).
func (r *router) call(ctx context.Context, req callRequest, onFrame frameFunc) (res *protocol.Result, err error) {
	if req.ID == "" {
		req.ID = newCallID()
	}
	ctx, span, tc := r.tracing.startHostCall(ctx, &req)
	defer func() { endHostCall(span, res, err) }()
	h, err := r.checkHost(req.Host)
	if err != nil {
		return nil, err
	}
	env, err := r.envelopeSigner(&h)
	if err != nil {
		return nil, err
	}
	if err := signing.CheckCaller(&req.Caller); err != nil {
		return nil, err
	}
	c := protocol.Call{
		ID: req.ID, Protocol: protocol.Version, Host: req.Host, Tool: req.Tool,
		Caller: req.Caller, TimeoutMS: req.Timeout.Milliseconds(), Args: req.Args,
	}
	fl := &inflight{host: c.Host, notify: make(chan struct{}, 1), sent: &sentCall{host: c.Host, tool: c.Tool, caller: c.Caller, args: c.Args}}
	r.track(c.ID, fl)
	defer r.untrack(c.ID, fl)
	parts, err := r.send(&c, env, tc)
	if err != nil {
		return nil, err
	}
	w := waiter{r: r, call: &c, fl: fl, onFrame: onFrame, hold: req.Hold, env: env, receipt: req.Receipt,
		tc: tc, sentAt: time.Now(), oneMessage: parts == 1}
	defer w.giveBack()
	return w.wait(ctx)
}

func (r *router) track(id string, fl *inflight) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[id] = fl
	if r.byHost[fl.host] == nil {
		r.byHost[fl.host] = make(map[string]*inflight)
	}
	r.byHost[fl.host][id] = fl
}

func (r *router) untrack(id string, fl *inflight) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.calls, id)
	if delete(r.byHost[fl.host], id); len(r.byHost[fl.host]) == 0 {
		delete(r.byHost, fl.host)
	}
	if fl.sent != nil {
		r.recent.add(id, fl.sent, time.Now())
	}
}

// unknownHost is the error for a host the gateway does not know. A host a
// caller may not see gets exactly this error too, so the answer never
// tells whether such a host exists.
func unknownHost(host string) *HostError {
	return &HostError{Host: host, Kind: HostUnknown, Msg: fmt.Sprintf("unknown host %q: call the hosts tool to list the fleet", host)}
}

func (r *router) checkHost(host string) (HostInfo, error) {
	if err := protocol.ValidateHost(host); err != nil {
		return HostInfo{}, &HostError{Host: host, Kind: HostUnknown, Msg: fmt.Sprintf("invalid host: %v", err)}
	}
	h, ok := r.reg.get(host)
	if !ok {
		return h, unknownHost(host)
	}
	if h.Revoked {
		return h, &HostError{Host: host, Kind: HostRevoked, Msg: fmt.Sprintf("host %q was revoked: its agent may no longer join the fleet; call hosts to see which hosts are online", host)}
	}
	if h.IdentityConflict {
		return h, &HostError{Host: host, Kind: HostConflict, Msg: fmt.Sprintf("host %q is claimed by more than one machine: %s", host, h.Conflict)}
	}
	if h.Conflict != "" {
		return h, &HostError{Host: host, Kind: HostConflict, Msg: fmt.Sprintf("host %q is claimed by more than one machine (%s); calls are refused until each agent has its own --name", host, h.Conflict)}
	}
	if !h.Online {
		return h, &HostError{Host: host, Kind: HostOffline, Msg: fmt.Sprintf("host %q is offline (last seen %s ago); call hosts to see which hosts are online",
			host, r.reg.now().Sub(h.LastSeen).Round(time.Second))}
	}
	return h, nil
}

// send publishes the call, split into parts that fit the server's
// max_payload. The arguments go straight from the client's request into
// the parts (nats.go copies each into its buffer), so a large write costs
// no copy of its content here. Every part carries the call's trace
// context, when it has one; the first its signed envelope.
func (r *router) send(c *protocol.Call, env signing.HostSigner, tc propagation.MapCarrier) (parts int, _ error) {
	// Room for the envelope in the first part's headers.
	size := min(protocol.ChunkSize, int(r.nc.MaxPayload())-4096)
	reply := protocol.ReplySubject(r.inbox, c.Host)
	traceparent, tracestate := traceHeaders(tc)
	sign := func(n int64, sum [sha256.Size]byte) (string, error) {
		return env.SignCall(c, reply, n, sum), nil
	}
	var sendErr error
	err := protocol.EncodeCallParts(c, size, sign, func(part, n int, auth string, data []byte) error {
		parts = n
		h, body := protocol.Frame{Kind: protocol.KindCall, CallID: c.ID, Seq: uint64(part), Part: part, Parts: n, Auth: auth, Data: data}.Encode()
		protocol.SetTrace(h, traceparent, tracestate)
		sendErr = r.nc.PublishMsg(&nats.Msg{Subject: protocol.CallSubject(c.Host), Reply: reply, Header: nats.Header(h), Data: body})
		return sendErr
	})
	switch {
	case sendErr != nil:
		return 0, &HostError{Host: c.Host, Kind: HostUnreachable, Msg: fmt.Sprintf("send %s call to %s: %v", c.Tool, c.Host, sendErr)}
	case err != nil:
		return 0, &HostError{Host: c.Host, Kind: HostUnreachable, Msg: fmt.Sprintf("call to %s cannot be sent: %v", c.Host, err)}
	}
	return parts, nil
}

func (r *router) close() {
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
	}
	if r.refusedSub != nil {
		_ = r.refusedSub.Unsubscribe()
	}
}

func newCallID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "c" + hex.EncodeToString(b)
}

// waiter follows one call until its result arrives or it fails.
type waiter struct {
	ctx     context.Context
	r       *router
	call    *protocol.Call
	fl      *inflight
	onFrame frameFunc
	// env signs the call's cancels and fetches; receipt, when not nil,
	// receives the result's receipt as checked.
	env     signing.HostSigner
	receipt *audit.Receipt

	// hold, when not nil, keeps what the call's result takes of the
	// transfer budget; taken counts what the waiter took itself and gives
	// back when the call returns, got all it took for the result.
	hold  *transferHold
	taken int64
	got   int64

	// claim is the size the result being delivered says it has (its
	// parts times the size of its first); partAt is when its last part
	// arrived, or when it was asked for again.
	claim  int64
	partAt time.Time

	// A call that found nobody listening on its host, which the registry
	// still has online, waits up to rejoinGrace from sentAt for the agent
	// to come back (a reconnection to another node, or with a renewed
	// credential). rejoin, when set, asks the agent whether it has the
	// call; one that answers it has no record of it gets it again (at
	// most maxResends times): it never took it in, so it cannot run it
	// twice. The question, like the call, is signed for the agent process
	// the call was sent to (its instance): a restarted agent refuses it,
	// and never gets a call its predecessor may have run. Only a call
	// sent as one message is sent again.
	tc         propagation.MapCarrier
	sentAt     time.Time
	oneMessage bool
	rejoin     *time.Timer
	rejoining  bool
	resends    int

	asm       *protocol.Assembly
	broken    bool // the current delivery lost a part; skip until a new part 1
	heard     bool // the agent has sent at least one frame
	fetched   bool // a fetch has been sent
	lastHeard time.Time
	refetch   int // fetches sent because result parts were lost
}

// maxRefetch bounds re-fetches of a result whose parts keep getting lost.
const maxRefetch = 3

// rejoinGrace is how long a call waits for a host that nobody listens for
// (see waiter.rejoin); rejoinProbe how often it asks meanwhile;
// maxResends how often a call is sent again.
const (
	rejoinGrace = 3 * time.Second
	rejoinProbe = 200 * time.Millisecond
	maxResends  = 2
)

func (w *waiter) wait(ctx context.Context) (*protocol.Result, error) {
	w.ctx = ctx
	host, id := w.call.Host, w.call.ID
	w.lastHeard = time.Now()
	silence := time.NewTimer(w.r.silence)
	defer silence.Stop()
	var deadline <-chan time.Time
	if t := w.call.Timeout(); t > 0 {
		timer := time.NewTimer(t + w.r.silence)
		defer timer.Stop()
		deadline = timer.C
	}
	defer w.stopRejoin()
	for {
		select {
		case <-w.rejoinC():
			if err := w.restarted(); err != nil {
				return nil, err
			}
			w.r.fetch(w.env, host, id) // nobody listening: another 503, and the next probe

		case <-ctx.Done():
			w.r.cancel(w.env, host, id, "caller cancelled")
			return nil, ctx.Err()
		case <-deadline:
			w.r.cancel(w.env, host, id, "deadline exceeded")
			return nil, &HostError{Host: host, Kind: HostTimeout, Msg: fmt.Sprintf("%s on %s did not finish within %s", w.call.Tool, host, w.call.Timeout())}
		case now := <-silence.C:
			if err := w.onSilence(now); err != nil {
				w.r.cancel(w.env, host, id, "host went silent")
				return nil, err
			}
			if err := w.checkStall(now); err != nil {
				w.r.cancel(w.env, host, id, "result stopped arriving")
				return nil, err
			}
			silence.Reset(w.r.silence / 2)
		case <-w.fl.notify:
			frames, noResponders, refused := w.fl.take()
			if refused != nil {
				return nil, refusedError(refused, w.call.Tool)
			}
			if noResponders && !w.heard {
				if w.awaitRejoin() {
					continue
				}
				if w.fetched && !w.rejoining {
					// The call went out, then the host fell silent and
					// nobody took the fetch: it left mid-call.
					return nil, &HostError{Host: host, Kind: HostSilent, Msg: fmt.Sprintf("host %s went silent during %s and is no longer connected to the fleet; it may have crashed or lost its network", host, w.call.Tool)}
				}
				return nil, &HostError{Host: host, Kind: HostGone, Msg: fmt.Sprintf("host %s is not connected to the fleet right now (its agent is gone); call hosts to check it", host)}
			}
			// A fetch nobody answered, once the call was running: the agent
			// died or is reconnecting; the silence clock decides.
			if len(frames) == 0 {
				continue
			}
			w.heard, w.lastHeard = true, time.Now()
			silence.Reset(w.r.silence)
			if res, err := w.handle(frames); res != nil || err != nil {
				return res, err
			}
			if err := w.checkStall(time.Now()); err != nil {
				w.r.cancel(w.env, host, id, "result stopped arriving")
				return nil, err
			}
		}
	}
}

// checkStall asks for a result again when its delivery stalled: it began
// (or was asked for again) and no part of it came for the silence
// period, whatever other frames did. An agent sends a result's parts one
// after another; one that keeps a call alive with keepalives while it
// holds back the rest of a result would otherwise keep what the result
// took of the transfer budget for as long as the call may last. After
// maxRefetch such requests the call fails.
func (w *waiter) checkStall(now time.Time) error {
	if w.asm == nil && !w.broken || now.Sub(w.partAt) < w.r.silence || w.fl.resultWaiting() {
		return nil // parts that came while the waiter was busy are not lost
	}
	w.asm, w.broken = nil, true
	if w.refetch++; w.refetch > maxRefetch {
		return &HostError{Host: w.call.Host, Kind: HostUnreachable, Msg: fmt.Sprintf("host %s stopped sending the result of %s partway, %d times; the call is given up",
			w.call.Host, w.call.Tool, w.refetch)}
	}
	w.r.log.Warn("result stopped arriving; fetching it again", "host", w.call.Host, "call", w.call.ID, "after", now.Sub(w.partAt).Round(time.Millisecond))
	w.partAt = now
	w.r.fetch(w.env, w.call.Host, w.call.ID)
	return nil
}

// reserve takes from the transfer budget what a large result needs once
// received bytes of it have arrived: when they pass the room it holds,
// twice what has arrived (at least 2 MiB), up to the size it claims, so
// that an agent holds no more of the budget than it has sent, whatever
// it claims, and the result is copied a few times only as it grows. A
// result larger than it claimed grows up to protocol.MaxResultBytes the
// same way. With no room it drops the result's parts, waits for room for
// the whole result (at most the budget's wait), and fetches the result
// again from the agent, which keeps it; it then reports waited, and
// w.broken is set until the new first part arrives.
func (w *waiter) reserve(received int64) (waited bool, err error) {
	t := w.r.transfers
	claim := min(w.claim, protocol.MaxResultBytes)
	if received > claim {
		claim = protocol.MaxResultBytes // it said less than it sends
	}
	if t == nil || received <= w.got || max(w.claim, received) <= largeTransfer {
		return false, nil
	}
	need := min(max(2*received, 2*largeTransfer), claim) - w.got
	if t.tryAcquire(need) {
		w.keep(need)
		if w.asm != nil {
			// Room the budget holds for it, so that it is not copied
			// each time it grows.
			w.asm.Grow(int(w.got) - len(w.asm.Bytes()))
		}
		return false, nil
	}
	need = claim - w.got
	w.asm, w.broken = nil, true
	w.fl.discardResults(true)
	ctx, cancel := context.WithTimeout(w.ctx, t.wait)
	err = t.acquire(ctx, need)
	cancel()
	if err != nil {
		if w.ctx.Err() != nil {
			return true, w.ctx.Err()
		}
		return true, &HostError{Host: w.call.Host, Kind: HostBusy, Msg: t.busy(fmt.Sprintf("the result of %s on %s", w.call.Tool, w.call.Host), need)}
	}
	w.keep(need)
	w.fl.discardResults(false)
	w.lastHeard, w.partAt = time.Now(), time.Now()
	w.r.fetch(w.env, w.call.Host, w.call.ID)
	return true, nil
}

// keep records n bytes taken from the budget for the call's result: in
// its hold, which keeps them until the result is answered, or, with no
// hold open, by the waiter until the call returns.
func (w *waiter) keep(n int64) {
	w.got += n
	if w.hold == nil || !w.hold.adopt(n) {
		w.taken += n
	}
}

// giveBack returns what the waiter took itself.
func (w *waiter) giveBack() {
	if w.taken > 0 {
		w.r.transfers.release(w.taken)
		w.taken = 0
	}
}

// onSilence runs when the call has produced no frame for a while. It asks
// the agent for the call's state (repeatedly), and gives up once the host
// has been silent for twice the silence period. While the gateway itself
// is cut off from NATS nothing can be heard, so the clock stops.
func (w *waiter) onSilence(now time.Time) error {
	if !w.r.nc.IsConnected() {
		w.lastHeard = now
		return nil
	}
	if err := w.restarted(); err != nil {
		return err
	}
	if quiet := now.Sub(w.lastHeard); quiet >= 2*w.r.silence {
		return &HostError{Host: w.call.Host, Kind: HostSilent, Msg: fmt.Sprintf("host %s went silent during %s: no answer for %s; it may have crashed or lost its network",
			w.call.Host, w.call.Tool, quiet.Round(100*time.Millisecond))}
	}
	w.fetched = true
	w.r.fetch(w.env, w.call.Host, w.call.ID)
	return nil
}

// handle processes frames in order; it returns the result once complete.
func (w *waiter) handle(frames []protocol.Frame) (*protocol.Result, error) {
	for _, f := range frames {
		if f.Kind != protocol.KindResult {
			if w.onFrame != nil {
				w.onFrame(f)
			}
			continue
		}
		if f.Part == 1 {
			w.asm, w.broken = protocol.NewAssembly(protocol.MaxResultBytes), false
			w.claim = int64(f.Parts) * int64(len(f.Data))
			if w.got > 0 {
				w.asm.Grow(int(w.got)) // room the budget holds for it already
			}
		}
		if w.broken {
			continue // stragglers of a delivery already being fetched again
		}
		if w.asm == nil {
			w.asm = protocol.NewAssembly(protocol.MaxResultBytes) // Add reports the missing first part
		}
		waited, err := w.reserve(int64(len(w.asm.Bytes()) + len(f.Data)))
		if err != nil {
			return nil, err
		}
		if waited {
			return nil, nil // the result comes again
		}
		w.partAt = time.Now()
		done, err := w.asm.Add(f)
		if err != nil {
			w.asm, w.broken = nil, true
			if w.refetch++; w.refetch > maxRefetch {
				return nil, &HostError{Host: w.call.Host, Kind: HostUnreachable, Msg: fmt.Sprintf("result of %s on %s kept arriving incomplete: %v", w.call.Tool, w.call.Host, err)}
			}
			w.r.log.Warn("result frames lost; fetching the result again", "host", w.call.Host, "call", w.call.ID, "err", err)
			w.partAt = time.Now()
			w.r.fetch(w.env, w.call.Host, w.call.ID)
			return nil, nil
		}
		if !done {
			continue
		}
		res, err := protocol.DecodeResult(w.asm.Bytes())
		if err != nil {
			return nil, &HostError{Host: w.call.Host, Kind: HostUnreachable, Msg: fmt.Sprintf("host %s sent an unreadable result: %v", w.call.Host, err)}
		}
		if res.CallID != w.call.ID {
			return nil, &HostError{Host: w.call.Host, Kind: HostUnreachable, Msg: fmt.Sprintf("host %s answered call %s with the result of call %s", w.call.Host, w.call.ID, res.CallID)}
		}
		if err := w.r.checkReceipt(w.call, res, w.asm.Bytes(), f.Receipt, w.receipt); err != nil {
			return nil, err
		}
		if resent, err := w.resend(res); resent || err != nil {
			return nil, err
		}
		return res, nil
	}
	return nil, nil
}

// restarted returns the error of a call whose host's agent has announced
// a new process since the call was sent to the one before: that one is
// gone, and the new one never answers for it.
func (w *waiter) restarted() error {
	h, ok := w.r.reg.get(w.call.Host)
	if !ok || h.Instance == "" || w.env.Instance() == "" || h.Instance == w.env.Instance() {
		return nil
	}
	return &HostError{Host: w.call.Host, Kind: HostSilent, Msg: fmt.Sprintf(
		"the agent on %s restarted during %s: the call was sent to its previous process, which may have run it, or part of it, before it stopped; check before running it again (the new process never runs it)",
		w.call.Host, w.call.Tool)}
}

// rejoinC is the channel of the rejoin timer; nil (never ready) before
// the call first waits for its agent.
func (w *waiter) rejoinC() <-chan time.Time {
	if w.rejoin == nil {
		return nil
	}
	return w.rejoin.C
}

func (w *waiter) stopRejoin() {
	if w.rejoin != nil {
		w.rejoin.Stop()
	}
}

// awaitRejoin reports whether a call that found nobody listening on its
// host waits for the agent to come back: sent as one message, within
// rejoinGrace of its sending, and not more often than maxResends sent
// again. It then asks the agent after rejoinProbe.
func (w *waiter) awaitRejoin() bool {
	if !w.oneMessage || w.resends >= maxResends || time.Since(w.sentAt) >= min(rejoinGrace, w.r.silence) {
		return false
	}
	w.rejoining = true
	if w.rejoin == nil {
		w.rejoin = time.NewTimer(rejoinProbe) // made only for the calls that need it
	} else {
		w.rejoin.Reset(rejoinProbe)
	}
	return true
}

// resend sends the call again when res is its agent's answer, while the
// call waits for the agent to come back, that it has no record of it.
func (w *waiter) resend(res *protocol.Result) (bool, error) {
	if !w.rejoining || res.Error == nil || res.Error.Code != protocol.CodeUnknownCall {
		return false, nil
	}
	w.rejoining, w.heard, w.asm = false, false, nil
	w.stopRejoin()
	w.resends++
	w.r.log.Info("the host came back without the call; sending it again", "host", w.call.Host, "call", w.call.ID, "tool", w.call.Tool,
		"after", time.Since(w.sentAt).Round(time.Millisecond))
	w.sentAt = time.Now()
	if _, err := w.r.send(w.call, w.env, w.tc); err != nil {
		return true, err
	}
	return true, nil
}
