package agent

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/fleetmcp/fleetmcp/agent/callauth"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// job is one accepted call, from the moment it is queued until its result
// is published.
type job struct {
	call   *protocol.Call
	reply  string
	tool   toolFunc
	ctx    context.Context
	cancel context.CancelFunc
	seq    atomic.Uint64
	// pol is the host policy the call is held to: the host's, narrowed
	// for its caller (policy.Policy.ForCaller); start is when the agent
	// took it in (its receipt says so).
	pol   *policy.Policy
	start time.Time
	// exit is the exit status of the command the call ran (nil: none).
	exit *int
	// span covers the call until its result is published (it records
	// nothing when the call is not traced).
	span trace.Span
}

// finished is a result kept for re-fetching.
type finished struct {
	id      string
	data    []byte // the result as protocol.EncodeResult encodes it
	receipt string // its receipt (protocol.HeaderReceipt)
	expires time.Time
}

// droppedCall is a finished call whose result went over the table's byte
// limit before its TTL: only its ID is kept, until then.
type droppedCall struct {
	id      string
	expires time.Time
}

// callTable tracks running calls and recently finished results by call ID,
// so a cancel reaches the right call, a repeated call is never run twice
// and a lost result can be fetched again.
//
// Results are kept for ttl and maxBytes in all, the oldest dropped first.
// A dropped result's call ID is still kept until its TTL (maxDropped IDs
// at most), so that a call sent again after its result was dropped is not
// run again either: it is answered protocol.CodeResultDropped.
type callTable struct {
	ttl        time.Duration
	maxBytes   int
	maxDropped int
	log        *slog.Logger // nil: no log

	mu     sync.Mutex
	active map[string]*job
	done   map[string]*list.Element // of *finished, oldest at Front
	order  *list.List
	bytes  int
	// dropped holds the IDs of dropped results, in the order dropped
	// (which is the order they expire: the TTL is the same for all).
	dropped     map[string]struct{}
	droppedList []droppedCall
	droppedHead int
	// warnedAt is when the log last said IDs were forgotten early.
	warnedAt time.Time
}

// maxDroppedCalls bounds the call IDs kept after their results were
// dropped: about 150 bytes each at most (the map entry, the queue's
// entry and room to grow), some 40 MB in all.
const maxDroppedCalls = 1 << 18

func newCallTable(ttl time.Duration, log *slog.Logger) *callTable {
	return &callTable{
		ttl:        ttl,
		maxBytes:   256 << 20,
		maxDropped: maxDroppedCalls,
		log:        log,
		active:     make(map[string]*job),
		done:       make(map[string]*list.Element),
		order:      list.New(),
		dropped:    make(map[string]struct{}),
	}
}

// lookup returns the running job or the finished result for id, and
// whether id finished but its result was dropped.
func (t *callTable) lookup(id string) (*job, *finished, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if j := t.active[id]; j != nil {
		return j, nil, false
	}
	if e := t.done[id]; e != nil {
		return nil, e.Value.(*finished), false
	}
	_, dropped := t.dropped[id]
	return nil, nil, dropped
}

// start registers j unless a call with its ID is known already.
func (t *callTable) start(j *job) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	id := j.call.ID
	if _, dropped := t.dropped[id]; dropped || t.active[id] != nil || t.done[id] != nil {
		return false
	}
	t.active[id] = j
	return true
}

// abandon forgets a job that never ran.
func (t *callTable) abandon(id string) {
	t.mu.Lock()
	delete(t.active, id)
	t.mu.Unlock()
}

// finish moves id from running to finished with its encoded result and
// the result's receipt.
func (t *callTable) finish(id string, data []byte, receipt string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.active, id)
	t.done[id] = t.order.PushBack(&finished{id: id, data: data, receipt: receipt, expires: now.Add(t.ttl)})
	t.bytes += len(data)
	t.pruneLocked(now)
}

func (t *callTable) prune(now time.Time) {
	t.mu.Lock()
	t.pruneLocked(now)
	t.mu.Unlock()
}

func (t *callTable) pruneLocked(now time.Time) {
	for e := t.order.Front(); e != nil; e = t.order.Front() {
		f := e.Value.(*finished)
		live := now.Before(f.expires)
		if live && t.bytes <= t.maxBytes {
			break
		}
		t.order.Remove(e)
		delete(t.done, f.id)
		t.bytes -= len(f.data)
		if live {
			t.keepDroppedLocked(droppedCall{id: f.id, expires: f.expires}, now)
		}
	}
	for t.droppedHead < len(t.droppedList) && !now.Before(t.droppedList[t.droppedHead].expires) {
		t.forgetDroppedLocked()
	}
}

// keepDroppedLocked keeps the ID of a call whose result was dropped, the
// oldest forgotten first once maxDropped are kept (and the log says so,
// once a minute at most: a call sent again with a forgotten ID would run
// again).
func (t *callTable) keepDroppedLocked(d droppedCall, now time.Time) {
	if _, ok := t.dropped[d.id]; ok {
		return
	}
	for len(t.dropped) >= t.maxDropped && t.droppedHead < len(t.droppedList) {
		if early := now.Before(t.droppedList[t.droppedHead].expires); early && t.log != nil && now.Sub(t.warnedAt) >= time.Minute {
			t.warnedAt = now
			t.log.Warn("results are dropped for room so fast that the IDs of their calls are forgotten before their TTL; a call sent again with a forgotten ID would run again",
				"ids_kept", t.maxDropped, "results_kept_mib", t.maxBytes>>20, "ttl", t.ttl)
		}
		t.forgetDroppedLocked()
	}
	t.dropped[d.id] = struct{}{}
	t.droppedList = append(t.droppedList, d)
}

func (t *callTable) forgetDroppedLocked() {
	delete(t.dropped, t.droppedList[t.droppedHead].id)
	t.droppedList[t.droppedHead] = droppedCall{}
	t.droppedHead++
	// Reuse the slice once its forgotten front is at least half of it.
	if t.droppedHead >= len(t.droppedList)/2 {
		n := copy(t.droppedList, t.droppedList[t.droppedHead:])
		clear(t.droppedList[n:])
		t.droppedList = t.droppedList[:n]
		t.droppedHead = 0
	}
}

func (t *callTable) cancel(id string) bool {
	t.mu.Lock()
	j := t.active[id]
	t.mu.Unlock()
	if j != nil {
		j.cancel()
	}
	return j != nil
}

func (t *callTable) running() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.active)
}

func (t *callTable) snapshot() []*job {
	t.mu.Lock()
	defer t.mu.Unlock()
	jobs := make([]*job, 0, len(t.active))
	for _, j := range t.active {
		jobs = append(jobs, j)
	}
	return jobs
}

// pending is a call whose parts are still arriving.
type pending struct {
	asm *protocol.Assembly
	// claims are the call's envelope, checked when its first part came:
	// the parts must add up to the body it signed.
	claims  *protocol.Claims
	reply   string
	started time.Time
	// seq numbers the keepalives sent for the call so far; the call's
	// own frames continue from it.
	seq uint64
}

// maxPending bounds calls being assembled at once.
const maxPending = 64

// pendingTimeout is how long the parts of one call may take to arrive.
const pendingTimeout = 30 * time.Second

type assembler struct {
	mu    sync.Mutex
	calls map[string]*pending
	// decoding are the calls complete but not yet taken in.
	decoding map[string]*pending
}

// pendingKeepalive is a keepalive due for a call being assembled.
type pendingKeepalive struct {
	id, reply string
	seq       uint64
}

// keepalives returns a keepalive for every call being assembled.
func (s *assembler) keepalives() []pendingKeepalive {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := make([]pendingKeepalive, 0, len(s.calls))
	for id, p := range s.calls {
		p.seq++
		ks = append(ks, pendingKeepalive{id: id, reply: p.reply, seq: p.seq})
	}
	return ks
}

// forget drops call id once it is complete and taken in.
func (s *assembler) forget(id string) {
	s.mu.Lock()
	delete(s.decoding, id)
	s.mu.Unlock()
}

// touch returns the next sequence number of call id when it is being
// assembled.
func (s *assembler) touch(id string) (seq uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.calls[id]
	if p == nil {
		p = s.decoding[id]
	}
	if p == nil {
		return 0, false
	}
	p.seq++
	return p.seq, true
}

// onCall runs on the subscription's goroutine: it must never block. It
// checks the call's envelope with its first part, before anything else
// (callcheck.go), assembles its parts, checks they are the body the
// envelope signed, and hands the complete call to the pool. A message
// that fails a check is never run, and is answered only when its
// envelope vouches for the reply subject.
func (a *Agent) onCall(m *nats.Msg) {
	f, err := protocol.DecodeFrame(m.Header, m.Data)
	if err == nil && f.Kind != protocol.KindCall {
		err = fmt.Errorf("frame kind %q on the call subject; want %q", f.Kind, protocol.KindCall)
	}
	if err != nil {
		a.refuse(protocol.MsgCall, nil, &protocol.EnvelopeError{Reason: protocol.RefusedMalformed, Msg: "malformed call message: " + err.Error()})
		return
	}
	var claims *protocol.Claims
	if f.Part == 1 {
		c, err := a.auth.Open(f.Auth, callauth.Expect{Kind: protocol.MsgCall, Reply: m.Reply, CallID: f.CallID})
		if err != nil {
			a.refuseCall(m.Reply, f.CallID, c, err, 0)
			return
		}
		if err := a.auth.Seen(c); err != nil && f.Parts > 1 {
			a.refuseCall(m.Reply, f.CallID, c, err, 0)
			return
		}
		if c.BodySize > int64(a.cfg.MaxRequestBytes) {
			a.counts.refused.Add(1)
			a.replyResult(m.Reply, protocol.ErrorResult(f.CallID, protocol.CodeTooLarge,
				fmt.Sprintf("call of %d bytes exceeds this host's limit of %d bytes", c.BodySize, a.cfg.MaxRequestBytes)), 0)
			return
		}
		claims = c
	}
	data, at, err := a.assemble(f, m.Reply, claims)
	if err != nil {
		if at != nil { // the call's first part was checked: its reply subject is the gateway's
			a.replyResult(at.reply, protocol.ErrorResult(f.CallID, protocol.CodeIncomplete, err.Error()), at.seq)
		} else {
			a.log.Debug("ignoring a call part", "call", f.CallID, "err", err)
		}
		return
	}
	if data == nil {
		return // more parts to come
	}
	defer a.pend.forget(f.CallID)
	claims = at.claims
	if err := callauth.CheckBody(claims, data); err == nil {
		err = a.auth.Commit(claims)
		if err != nil {
			a.refuseCall(at.reply, f.CallID, claims, err, at.seq)
			return
		}
	} else {
		a.refuseCall(at.reply, f.CallID, claims, err, at.seq)
		return
	}
	var call protocol.Call
	if err := json.Unmarshal(data, &call); err != nil {
		a.replyResult(at.reply, protocol.ErrorResult(f.CallID, protocol.CodeBadRequest, "call is not valid JSON: "+err.Error()), at.seq)
		return
	}
	if call.ID != claims.CallID || call.Host != claims.Host || call.Tool != claims.Tool || call.TimeoutMS != claims.TimeoutMS {
		a.replyResult(at.reply, protocol.ErrorResult(f.CallID, protocol.CodeBadRequest, fmt.Sprintf(
			"the call names id %q, host %q, tool %q and %d ms; its envelope signed %q, %q, %q and %d ms",
			call.ID, call.Host, call.Tool, call.TimeoutMS, claims.CallID, claims.Host, claims.Tool, claims.TimeoutMS)), at.seq)
		return
	}
	// Who the call is for is what the envelope says.
	call.Caller = callerFromClaims(claims.Caller, call.Caller.Name)
	// The part that completes the call carries its trace context, as
	// every part does (it decides nothing).
	a.accept(a.tracing.remote(m.Header), &call, claims, f.CallID, at.reply, at.seq)
}

// assembled is what onCall needs of a call whose first part was
// checked: its envelope's claims, and the reply subject and the last
// sequence number its answers go with (taken under the assembler's lock).
type assembled struct {
	claims *protocol.Claims
	reply  string
	seq    uint64
}

// assemble adds f to its call; claims are its envelope's, for its first
// part. Once the call is complete it returns its data; until then nil.
// at is the call once its first part was checked (nil before: a part
// that belongs to no such call).
func (a *Agent) assemble(f protocol.Frame, reply string, claims *protocol.Claims) (data []byte, at *assembled, err error) {
	if f.Parts == 1 {
		at = &assembled{claims: claims, reply: reply}
		if len(f.Data) > a.cfg.MaxRequestBytes {
			return nil, at, fmt.Errorf("call of %d bytes exceeds this host's limit of %d bytes", len(f.Data), a.cfg.MaxRequestBytes)
		}
		return f.Data, at, nil
	}
	a.pend.mu.Lock()
	defer a.pend.mu.Unlock()
	p := a.pend.calls[f.CallID]
	if p == nil {
		if f.Part != 1 || claims == nil {
			return nil, nil, fmt.Errorf("call %s: part %d of %d arrived without its first part", f.CallID, f.Part, f.Parts)
		}
		if len(a.pend.calls) >= maxPending {
			return nil, &assembled{claims: claims, reply: reply}, fmt.Errorf("host %s is assembling %d large calls already; retry shortly", a.cfg.Name, maxPending)
		}
		p = &pending{asm: protocol.NewAssembly(max(1, int(min(claims.BodySize, int64(a.cfg.MaxRequestBytes))))), claims: claims, reply: reply, started: time.Now()}
		a.pend.calls[f.CallID] = p
	} else if claims != nil {
		// A first part again, for a call being assembled: the first
		// delivery is lost with it.
		delete(a.pend.calls, f.CallID)
		return nil, &assembled{claims: p.claims, reply: p.reply, seq: p.seq}, fmt.Errorf("call %s: its first part arrived twice", f.CallID)
	}
	done, err := p.asm.Add(f)
	if err != nil || done {
		delete(a.pend.calls, f.CallID)
	}
	if done {
		// While onCall decodes it, a fetch is answered with a
		// keepalive (forget ends that).
		a.pend.decoding[f.CallID] = p
	}
	at = &assembled{claims: p.claims, reply: p.reply, seq: p.seq}
	if err != nil {
		return nil, at, err
	}
	if done {
		return p.asm.Bytes(), at, nil
	}
	return nil, at, nil
}

// prunePending fails calls whose parts stopped arriving.
func (a *Agent) prunePending(now time.Time) {
	a.pend.mu.Lock()
	var stale []pendingKeepalive
	for id, p := range a.pend.calls {
		if now.Sub(p.started) > pendingTimeout {
			stale = append(stale, pendingKeepalive{id: id, reply: p.reply, seq: p.seq})
			delete(a.pend.calls, id)
		}
	}
	a.pend.mu.Unlock()
	for _, c := range stale {
		a.replyResult(c.reply, protocol.ErrorResult(c.id, protocol.CodeIncomplete,
			fmt.Sprintf("parts of call %s stopped arriving after %s", c.id, pendingTimeout)), c.seq)
	}
}

// accept validates a complete call, whose envelope's claims are claims,
// and queues it. seq is the last sequence number already used on reply;
// parent, when not nil, is the call's trace context (tracing.remote).
// The host policy decides on the caller the envelope names.
func (a *Agent) accept(parent context.Context, call *protocol.Call, claims *protocol.Claims, frameID, reply string, seq uint64) {
	span := a.tracing.startServe(parent, call, a.cfg.Name)
	fail := func(code protocol.Code, format string, args ...any) {
		a.counts.refused.Add(1)
		res := protocol.ErrorResult(frameID, code, fmt.Sprintf(format, args...))
		a.replyResult(reply, res, seq)
		endSpan(span, res, "")
	}
	switch {
	case call.ID != frameID:
		fail(protocol.CodeBadRequest, "call id %q does not match its frame id %q", call.ID, frameID)
		return
	case call.Protocol != protocol.Version:
		fail(protocol.CodeVersion, "call uses protocol version %d; host %s speaks version %d", call.Protocol, a.cfg.Name, protocol.Version)
		return
	case call.Host != a.cfg.Name:
		fail(protocol.CodeBadRequest, "call for host %q reached host %q", call.Host, a.cfg.Name)
		return
	}
	if j, done, dropped := a.calls.lookup(call.ID); j != nil || done != nil || dropped {
		// A call id run already, in a new envelope: never run it twice.
		a.replyState(reply, call.ID)
		endSpan(span, nil, "repeated")
		return
	}
	ps := a.tracing.child(span, "fleet.policy", "")
	hp := a.served()
	tool := hp.tools[call.Tool]
	switch {
	case tool == nil && hp.refused[call.Tool]:
		endPolicy(ps, "denied", hp.pol.Digest())
		fail(protocol.CodeDenied, "%v; host %s serves: %s", hp.pol.AllowTool(call.Tool), a.cfg.Name, strings.Join(hp.toolList(), ", "))
		return
	case tool == nil:
		endPolicy(ps, "unknown_tool", hp.pol.Digest())
		fail(protocol.CodeUnknownTool, "host %s does not serve tool %q; it serves: %s", a.cfg.Name, call.Tool, strings.Join(hp.toolList(), ", "))
		return
	}
	pol, err := hp.pol.ForCaller(policyCaller(claims.Caller))
	if err == nil {
		err = pol.AllowTool(policyTool(call.Tool))
	}
	if err != nil {
		endPolicy(ps, "denied", hp.pol.Digest())
		fail(protocol.CodeDenied, "%v", err)
		return
	}
	endPolicy(ps, "allowed", hp.pol.Digest())
	if pol != hp.pol {
		tool = a.tb.withPolicy(pol).tools()[call.Tool]
	}
	ctx, cancel := context.WithCancel(a.workCtx)
	if d := call.Timeout(); d > 0 {
		ctx, cancel = context.WithTimeout(a.workCtx, d)
	}
	j := &job{call: call, reply: reply, tool: tool, ctx: ctx, cancel: cancel, pol: pol, start: time.Now(), span: span}
	j.seq.Store(seq)
	if !a.calls.start(j) {
		cancel()
		a.replyState(reply, call.ID)
		endSpan(span, nil, "repeated")
		return
	}
	if err := a.enqueue(j); err != nil {
		a.calls.abandon(call.ID)
		cancel()
		fail(err.code, "%s", err.msg)
	}
}

type enqueueErr struct {
	code protocol.Code
	msg  string
}

func (a *Agent) enqueue(j *job) *enqueueErr {
	a.queueMu.Lock()
	defer a.queueMu.Unlock()
	if a.draining.Load() {
		return &enqueueErr{protocol.CodeShuttingDown, fmt.Sprintf("host %s is shutting down and takes no new calls", a.cfg.Name)}
	}
	select {
	case a.slots <- struct{}{}:
		a.queue <- j // never blocks: the queue has room for every slot
		return nil
	default:
		return &enqueueErr{protocol.CodeBusy, fmt.Sprintf("host %s is busy: %d calls running and %d queued, its limits (fleet-agent --max_concurrent, --max_queue); retry shortly",
			a.cfg.Name, a.cfg.MaxConcurrent, a.cfg.MaxQueue)}
	}
}

// stopQueue refuses further calls and lets the workers finish the queue.
func (a *Agent) stopQueue() {
	a.queueMu.Lock()
	defer a.queueMu.Unlock()
	if !a.draining.Swap(true) {
		close(a.queue)
	}
}

func (a *Agent) worker() {
	for j := range a.queue {
		a.run(j)
		if a.afterRun != nil {
			a.afterRun()
		}
	}
}

func (a *Agent) run(j *job) {
	defer j.cancel()
	var res *protocol.Result
	if err := j.ctx.Err(); err != nil {
		res = protocol.ErrorResult(j.call.ID, protocol.CodeCancelled, "call was cancelled before it started")
	} else {
		res = a.invoke(j)
	}
	res.CallID = j.call.ID
	// Served before failed, and stats reads them the other way round:
	// an announce never shows more failed calls than served ones.
	a.counts.served.Add(1)
	if res.IsError || res.Error != nil {
		a.counts.failed.Add(1)
	}
	data, err := protocol.EncodeResult(res)
	if err != nil {
		res = protocol.ErrorResult(j.call.ID, protocol.CodeInternal, err.Error())
		data, _ = protocol.EncodeResult(res)
	}
	end := time.Now()
	receipt := a.receipt(res, data, j.start, end, j.exit)
	<-a.slots // before the result can be seen (see Agent.slots)
	a.calls.finish(j.call.ID, data, receipt, end)
	a.publishResult(j.reply, j.call.ID, data, receipt, &j.seq)
	endSpan(j.span, res, "")
}

func (a *Agent) invoke(j *job) (res *protocol.Result) {
	defer func() {
		if r := recover(); r != nil {
			a.log.Error("tool panicked", "tool", j.call.Tool, "call", j.call.ID, "panic", r)
			res = protocol.ErrorResult(j.call.ID, protocol.CodeInternal, fmt.Sprintf("tool %s failed unexpectedly: %v", j.call.Tool, r))
		}
	}()
	who := policy.Caller{Issuer: j.call.Caller.Issuer, Subject: j.call.Caller.Subject}.String()
	tc := &toolCall{ID: j.call.ID, Args: j.call.Args, Caller: who, Output: func(p []byte) { a.output(j, p) }}
	ctx, span := j.ctx, a.tracing.child(j.span, "fleet.tool ", j.call.Tool)
	if span.IsRecording() {
		ctx = trace.ContextWithSpan(ctx, span)
	}
	defer func() { endSpan(span, res, "") }()
	start := time.Now()
	res = j.tool(ctx, tc)
	j.exit = tc.exit
	if res == nil {
		res = protocol.ErrorResult(j.call.ID, protocol.CodeInternal, "tool "+j.call.Tool+" returned no result")
	}
	a.log.Debug("call done", "tool", j.call.Tool, "call", j.call.ID, "caller", j.call.Caller.Subject,
		"error", res.IsError || res.Error != nil, "took", time.Since(start))
	return res
}

// output streams live output. Output frames may be lost (the final result
// carries what matters), so a failed publish is only logged.
func (a *Agent) output(j *job, p []byte) {
	size := a.chunkSize()
	for len(p) > 0 {
		n := min(len(p), size)
		a.publishFrame(j.reply, protocol.Frame{Kind: protocol.KindOutput, CallID: j.call.ID, Seq: j.seq.Add(1), Data: p[:n]})
		p = p[n:]
	}
}

// keepalive tells the caller of every call, running or still arriving,
// that the host is alive.
func (a *Agent) keepalive() {
	for _, j := range a.calls.snapshot() {
		a.publishFrame(j.reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: j.call.ID, Seq: j.seq.Add(1)})
	}
	for _, k := range a.pend.keepalives() {
		a.publishFrame(k.reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: k.id, Seq: k.seq})
	}
}

// Bounds of the body of one message, below the server's max_payload.
const (
	// frameHeadroom is left for a frame's headers.
	frameHeadroom = 1 << 10
	// minChunkSize is the smallest chunk used, whatever the server says.
	minChunkSize = 1 << 10
)

// chunkSize returns the largest frame body to publish: protocol.ChunkSize,
// or less when the server takes only smaller messages.
func (a *Agent) chunkSize() int {
	nc := a.nc.Load()
	if nc == nil {
		return protocol.ChunkSize
	}
	mp := nc.MaxPayload()
	if mp <= 0 {
		return protocol.ChunkSize // not known yet
	}
	return int(max(min(int64(protocol.ChunkSize), mp-frameHeadroom), minChunkSize))
}

var errNotConnected = errors.New("not connected to NATS")

// publish sends f to subject. A frame without a subject to go to is
// dropped silently.
func (a *Agent) publish(subject string, f protocol.Frame) error {
	if subject == "" {
		return nil
	}
	nc := a.nc.Load()
	if nc == nil {
		return errNotConnected
	}
	h, body := f.Encode()
	return nc.PublishMsg(&nats.Msg{Subject: subject, Header: nats.Header(h), Data: body})
}

// publishFrame sends a frame that may be lost, such as output or a
// keepalive.
func (a *Agent) publishFrame(subject string, f protocol.Frame) {
	if err := a.publish(subject, f); err != nil {
		a.log.Debug("publish frame failed", "kind", f.Kind, "call", f.CallID, "err", err)
	}
}

// publishResult sends an encoded result in parts, its receipt with the
// last. A lost part loses the delivery (the caller fetches the result
// again), so the rest is not sent.
func (a *Agent) publishResult(reply, id string, data []byte, receipt string, seq *atomic.Uint64) {
	parts, err := protocol.Split(data, a.chunkSize())
	if err != nil {
		res := protocol.ErrorResult(id, protocol.CodeTooLarge, err.Error())
		data, _ = protocol.EncodeResult(res)
		receipt = a.receipt(res, data, time.Now(), time.Now(), nil)
		parts = [][]byte{data}
	}
	for i, p := range parts {
		f := protocol.Frame{Kind: protocol.KindResult, CallID: id, Seq: seq.Add(1), Part: i + 1, Parts: len(parts), Data: p}
		if i == len(parts)-1 {
			f.Receipt = receipt
		}
		if err := a.publish(reply, f); err != nil {
			a.log.Warn("publish result failed; it can be fetched again", "call", id, "part", i+1, "parts", len(parts), "err", err)
			return
		}
	}
}

// replyResult answers with res, a result no job produced (a refusal).
func (a *Agent) replyResult(reply string, res *protocol.Result, seq uint64) {
	data, _ := protocol.EncodeResult(res)
	var s atomic.Uint64
	s.Store(seq)
	now := time.Now()
	a.publishResult(reply, res.CallID, data, a.receipt(res, data, now, now, nil), &s)
}

// replyState answers with a call's current state: a keepalive while its
// parts arrive or it runs, its result once finished.
func (a *Agent) replyState(reply, id string) {
	if seq, ok := a.pend.touch(id); ok {
		a.publishFrame(reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: id, Seq: seq})
		return
	}
	j, done, dropped := a.calls.lookup(id)
	switch {
	case j != nil:
		a.publishFrame(reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: id, Seq: j.seq.Add(1)})
	case done != nil:
		var s atomic.Uint64
		a.publishResult(reply, id, done.data, done.receipt, &s)
	case dropped:
		a.replyResult(reply, protocol.ErrorResult(id, protocol.CodeResultDropped,
			fmt.Sprintf("host %s ran call %s, but no longer keeps its result: it keeps %d MiB of results, and dropped the oldest to keep later ones",
				a.cfg.Name, id, a.calls.maxBytes>>20)), 0)
	case a.callsQueued():
		// Fetches are heard apart from calls: the call may be among
		// those not taken in yet (large ones take a while).
		a.publishFrame(reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: id})
	default:
		a.replyResult(reply, protocol.ErrorResult(id, protocol.CodeUnknownCall,
			fmt.Sprintf("host %s has no record of call %s (results are kept for %s)", a.cfg.Name, id, a.cfg.ResultTTL)), 0)
	}
}

// callsQueued reports whether call messages wait to be taken in.
func (a *Agent) callsQueued() bool {
	sub := a.callSub.Load()
	if sub == nil {
		return false
	}
	n, _, err := sub.Pending()
	return err == nil && n > 0
}
