package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
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
	// HostRevoked: the host's agent was revoked.
	HostRevoked
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

	mu     sync.Mutex
	calls  map[string]*inflight            // by call ID
	byHost map[string]map[string]*inflight // by host, then call ID
}

// inflight buffers the frames of one call between the NATS callback (which
// must never block) and the goroutine waiting for the call.
type inflight struct {
	host         string
	mu           sync.Mutex
	frames       []protocol.Frame
	pendingBytes int
	dropped      int
	noResponders bool
	notify       chan struct{}
}

// maxPendingOutput bounds output frames buffered for a slow waiter; beyond
// it output frames are dropped (result frames never are).
const maxPendingOutput = 8 << 20

func newRouter(nc *nats.Conn, reg *registry, log *slog.Logger, silence time.Duration) (*router, error) {
	r := &router{
		nc: nc, reg: reg, log: log, silence: silence,
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
		r.log.Warn("dropping malformed reply frame", "host", host, "err", err)
		return
	}
	r.mu.Lock()
	fl := r.calls[f.CallID]
	r.mu.Unlock()
	if fl == nil || fl.host != host {
		return // a late frame of a finished call, or not this host's call
	}
	fl.mu.Lock()
	if f.Kind == protocol.KindOutput && fl.pendingBytes+len(f.Data) > maxPendingOutput {
		fl.dropped++
		fl.mu.Unlock()
		return
	}
	fl.frames = append(fl.frames, f)
	fl.pendingBytes += len(f.Data)
	fl.mu.Unlock()
	fl.wake()
}

func (fl *inflight) wake() {
	select {
	case fl.notify <- struct{}{}:
	default:
	}
}

func (fl *inflight) take() ([]protocol.Frame, bool) {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	frames, nr := fl.frames, fl.noResponders
	fl.frames, fl.noResponders, fl.pendingBytes = nil, false, 0
	return frames, nr
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
}

// frameFunc sees a call's output, progress and keepalive frames as they
// arrive, on the calling goroutine.
type frameFunc func(protocol.Frame)

// call routes req to its host and waits for the final result. Errors are
// *HostError for routing failures, or ctx's error when the caller gave up
// (the agent is then told to cancel the call).
func (r *router) call(ctx context.Context, req callRequest, onFrame frameFunc) (*protocol.Result, error) {
	if err := r.checkHost(req.Host); err != nil {
		return nil, err
	}
	if req.ID == "" {
		req.ID = newCallID()
	}
	c := protocol.Call{
		ID: req.ID, Protocol: protocol.Version, Host: req.Host, Tool: req.Tool,
		Caller: req.Caller, TimeoutMS: req.Timeout.Milliseconds(), Args: req.Args,
	}
	fl := &inflight{host: c.Host, notify: make(chan struct{}, 1)}
	r.track(c.ID, fl)
	defer r.untrack(c.ID, fl)
	if err := r.send(&c); err != nil {
		return nil, err
	}
	w := waiter{r: r, call: &c, fl: fl, onFrame: onFrame}
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
}

// unknownHost is the error for a host the gateway does not know. A host a
// caller may not see gets exactly this error too, so the answer never
// tells whether such a host exists.
func unknownHost(host string) *HostError {
	return &HostError{Host: host, Kind: HostUnknown, Msg: fmt.Sprintf("unknown host %q: call the hosts tool to list the fleet", host)}
}

func (r *router) checkHost(host string) error {
	if err := protocol.ValidateHost(host); err != nil {
		return &HostError{Host: host, Kind: HostUnknown, Msg: fmt.Sprintf("invalid host: %v", err)}
	}
	h, ok := r.reg.get(host)
	if !ok {
		return unknownHost(host)
	}
	if h.Revoked {
		return &HostError{Host: host, Kind: HostRevoked, Msg: fmt.Sprintf("host %q was revoked: its agent may no longer join the fleet; call hosts to see which hosts are online", host)}
	}
	if h.Conflict != "" {
		return &HostError{Host: host, Kind: HostConflict, Msg: fmt.Sprintf("host %q is claimed by more than one machine (%s); calls are refused until each agent has its own --name", host, h.Conflict)}
	}
	if !h.Online {
		return &HostError{Host: host, Kind: HostOffline, Msg: fmt.Sprintf("host %q is offline (last seen %s ago); call hosts to see which hosts are online",
			host, r.reg.now().Sub(h.LastSeen).Round(time.Second))}
	}
	return nil
}

// send publishes the call, split into parts that fit the server's
// max_payload.
func (r *router) send(c *protocol.Call) error {
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode call: %w", err)
	}
	size := min(protocol.ChunkSize, int(r.nc.MaxPayload())-1024)
	parts, err := protocol.Split(data, size)
	if err != nil {
		return &HostError{Host: c.Host, Kind: HostUnreachable, Msg: fmt.Sprintf("call to %s is too large: %v", c.Host, err)}
	}
	reply := protocol.ReplySubject(r.inbox, c.Host)
	for i, p := range parts {
		h, body := protocol.Frame{Kind: protocol.KindCall, CallID: c.ID, Seq: uint64(i + 1), Part: i + 1, Parts: len(parts), Data: p}.Encode()
		if err := r.nc.PublishMsg(&nats.Msg{Subject: protocol.CallSubject(c.Host), Reply: reply, Header: nats.Header(h), Data: body}); err != nil {
			return &HostError{Host: c.Host, Kind: HostUnreachable, Msg: fmt.Sprintf("send %s call to %s: %v", c.Tool, c.Host, err)}
		}
	}
	return nil
}

func (r *router) cancel(host, id, reason string) {
	data, _ := json.Marshal(protocol.Cancel{CallID: id, Reason: reason})
	if err := r.nc.Publish(protocol.CancelSubject(host), data); err != nil {
		r.log.Warn("send cancel failed", "host", host, "call", id, "err", err)
	}
}

func (r *router) fetch(host, id string) {
	data, _ := json.Marshal(protocol.Fetch{CallID: id})
	if err := r.nc.PublishRequest(protocol.FetchSubject(host), protocol.ReplySubject(r.inbox, host), data); err != nil {
		r.log.Warn("send fetch failed", "host", host, "call", id, "err", err)
	}
}

func (r *router) close() {
	if r.sub != nil {
		_ = r.sub.Unsubscribe()
	}
}

func newCallID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "c" + hex.EncodeToString(b)
}

// waiter follows one call until its result arrives or it fails.
type waiter struct {
	r       *router
	call    *protocol.Call
	fl      *inflight
	onFrame frameFunc

	asm       *protocol.Assembly
	broken    bool // the current delivery lost a part; skip until a new part 1
	heard     bool // the agent has sent at least one frame
	fetched   bool // a fetch has been sent
	lastHeard time.Time
	refetch   int // fetches sent because result parts were lost
}

// maxResultBytes bounds one encoded result; an agent cannot make the
// gateway buffer more for a call.
const maxResultBytes = 128 << 20

// maxRefetch bounds re-fetches of a result whose parts keep getting lost.
const maxRefetch = 3

func (w *waiter) wait(ctx context.Context) (*protocol.Result, error) {
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
	for {
		select {
		case <-ctx.Done():
			w.r.cancel(host, id, "caller cancelled")
			return nil, ctx.Err()
		case <-deadline:
			w.r.cancel(host, id, "deadline exceeded")
			return nil, &HostError{Host: host, Kind: HostTimeout, Msg: fmt.Sprintf("%s on %s did not finish within %s", w.call.Tool, host, w.call.Timeout())}
		case now := <-silence.C:
			if err := w.onSilence(now); err != nil {
				w.r.cancel(host, id, "host went silent")
				return nil, err
			}
			silence.Reset(w.r.silence / 2)
		case <-w.fl.notify:
			frames, noResponders := w.fl.take()
			if noResponders && !w.heard {
				if w.fetched {
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
		}
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
	if quiet := now.Sub(w.lastHeard); quiet >= 2*w.r.silence {
		return &HostError{Host: w.call.Host, Kind: HostSilent, Msg: fmt.Sprintf("host %s went silent during %s: no answer for %s; it may have crashed or lost its network",
			w.call.Host, w.call.Tool, quiet.Round(100*time.Millisecond))}
	}
	w.fetched = true
	w.r.fetch(w.call.Host, w.call.ID)
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
			w.asm, w.broken = protocol.NewAssembly(maxResultBytes), false
		}
		if w.broken {
			continue // stragglers of a delivery already being fetched again
		}
		if w.asm == nil {
			w.asm = protocol.NewAssembly(maxResultBytes) // Add reports the missing first part
		}
		done, err := w.asm.Add(f)
		if err != nil {
			w.asm, w.broken = nil, true
			if w.refetch++; w.refetch > maxRefetch {
				return nil, &HostError{Host: w.call.Host, Kind: HostUnreachable, Msg: fmt.Sprintf("result of %s on %s kept arriving incomplete: %v", w.call.Tool, w.call.Host, err)}
			}
			w.r.log.Warn("result frames lost; fetching the result again", "host", w.call.Host, "call", w.call.ID, "err", err)
			w.r.fetch(w.call.Host, w.call.ID)
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
		return res, nil
	}
	return nil, nil
}
