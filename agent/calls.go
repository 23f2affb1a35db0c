package agent

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

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
	// span covers the call until its result is published (it records
	// nothing when the call is not traced).
	span trace.Span
}

// finished is a result kept for re-fetching.
type finished struct {
	id      string
	data    []byte // the result as protocol.EncodeResult encodes it
	expires time.Time
}

// callTable tracks running calls and recently finished results by call ID,
// so a cancel reaches the right call, a repeated call is never run twice
// and a lost result can be fetched again.
type callTable struct {
	ttl      time.Duration
	maxBytes int

	mu     sync.Mutex
	active map[string]*job
	done   map[string]*list.Element // of *finished, oldest at Front
	order  *list.List
	bytes  int
}

func newCallTable(ttl time.Duration) *callTable {
	return &callTable{
		ttl:      ttl,
		maxBytes: 256 << 20,
		active:   make(map[string]*job),
		done:     make(map[string]*list.Element),
		order:    list.New(),
	}
}

// lookup returns the running job or the finished result for id.
func (t *callTable) lookup(id string) (*job, []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if j := t.active[id]; j != nil {
		return j, nil
	}
	if e := t.done[id]; e != nil {
		return nil, e.Value.(*finished).data
	}
	return nil, nil
}

// start registers j unless a call with its ID is known already.
func (t *callTable) start(j *job) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.active[j.call.ID] != nil || t.done[j.call.ID] != nil {
		return false
	}
	t.active[j.call.ID] = j
	return true
}

// abandon forgets a job that never ran.
func (t *callTable) abandon(id string) {
	t.mu.Lock()
	delete(t.active, id)
	t.mu.Unlock()
}

// finish moves id from running to finished with its encoded result.
func (t *callTable) finish(id string, data []byte, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.active, id)
	t.done[id] = t.order.PushBack(&finished{id: id, data: data, expires: now.Add(t.ttl)})
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
		if now.Before(f.expires) && t.bytes <= t.maxBytes {
			return
		}
		t.order.Remove(e)
		delete(t.done, f.id)
		t.bytes -= len(f.data)
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
	asm     *protocol.Assembly
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
// assembles the call's parts and hands the complete call to the pool.
func (a *Agent) onCall(m *nats.Msg) {
	f, err := protocol.DecodeFrame(m.Header, m.Data)
	if err == nil && f.Kind != protocol.KindCall {
		err = fmt.Errorf("frame kind %q on the call subject; want %q", f.Kind, protocol.KindCall)
	}
	if err != nil {
		a.log.Warn("ignoring malformed call message", "err", err)
		if m.Reply != "" && protocol.ValidateCallID(f.CallID) == nil {
			a.replyResult(m.Reply, protocol.ErrorResult(f.CallID, protocol.CodeBadRequest, fmt.Sprintf("malformed call message: %v", err)), 0)
		}
		return
	}
	data, reply, seq, err := a.assemble(f, m.Reply)
	if err != nil {
		a.replyResult(reply, protocol.ErrorResult(f.CallID, protocol.CodeIncomplete, err.Error()), seq)
		return
	}
	if data == nil {
		return // more parts to come
	}
	defer a.pend.forget(f.CallID)
	var call protocol.Call
	if err := json.Unmarshal(data, &call); err != nil {
		a.replyResult(reply, protocol.ErrorResult(f.CallID, protocol.CodeBadRequest, "call is not valid JSON: "+err.Error()), seq)
		return
	}
	// The part that completes the call carries its trace context, as
	// every part does.
	a.accept(a.tracing.remote(m.Header), &call, f.CallID, reply, seq)
}

// assemble adds f to its call. Once the call is complete it returns its
// data; until then nil. replyTo is where the call's frames go and seq the
// last sequence number used on it.
func (a *Agent) assemble(f protocol.Frame, reply string) (data []byte, replyTo string, seq uint64, err error) {
	if f.Parts == 1 {
		if len(f.Data) > a.cfg.MaxRequestBytes {
			return nil, reply, 0, fmt.Errorf("call of %d bytes exceeds this host's limit of %d bytes", len(f.Data), a.cfg.MaxRequestBytes)
		}
		return f.Data, reply, 0, nil
	}
	a.pend.mu.Lock()
	defer a.pend.mu.Unlock()
	p := a.pend.calls[f.CallID]
	if p == nil {
		if f.Part != 1 {
			return nil, reply, 0, fmt.Errorf("call %s: part %d of %d arrived without its first part", f.CallID, f.Part, f.Parts)
		}
		if len(a.pend.calls) >= maxPending {
			return nil, reply, 0, fmt.Errorf("host %s is assembling %d large calls already; retry shortly", a.cfg.Name, maxPending)
		}
		p = &pending{asm: protocol.NewAssembly(a.cfg.MaxRequestBytes), reply: reply, started: time.Now()}
		a.pend.calls[f.CallID] = p
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
	if err != nil {
		return nil, p.reply, p.seq, err
	}
	if done {
		return p.asm.Bytes(), p.reply, p.seq, nil
	}
	return nil, p.reply, p.seq, nil
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

// accept validates a complete call and queues it. seq is the last
// sequence number already used on reply; parent, when not nil, is the
// call's trace context (tracing.remote).
func (a *Agent) accept(parent context.Context, call *protocol.Call, frameID, reply string, seq uint64) {
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
	if j, data := a.calls.lookup(call.ID); j != nil || data != nil {
		// A repeated call (the gateway retried): never run it twice.
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
	endPolicy(ps, "allowed", hp.pol.Digest())
	ctx, cancel := context.WithCancel(a.workCtx)
	if d := call.Timeout(); d > 0 {
		ctx, cancel = context.WithTimeout(a.workCtx, d)
	}
	j := &job{call: call, reply: reply, tool: tool, ctx: ctx, cancel: cancel, span: span}
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
	case a.queue <- j:
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
		data, _ = protocol.EncodeResult(protocol.ErrorResult(j.call.ID, protocol.CodeInternal, err.Error()))
	}
	a.calls.finish(j.call.ID, data, time.Now())
	a.publishResult(j.reply, j.call.ID, data, &j.seq)
	endSpan(j.span, res, "")
}

func (a *Agent) invoke(j *job) (res *protocol.Result) {
	defer func() {
		if r := recover(); r != nil {
			a.log.Error("tool panicked", "tool", j.call.Tool, "call", j.call.ID, "panic", r)
			res = protocol.ErrorResult(j.call.ID, protocol.CodeInternal, fmt.Sprintf("tool %s failed unexpectedly: %v", j.call.Tool, r))
		}
	}()
	tc := &toolCall{ID: j.call.ID, Args: j.call.Args, Caller: j.call.Caller.Subject, Output: func(p []byte) { a.output(j, p) }}
	ctx, span := j.ctx, a.tracing.child(j.span, "fleet.tool ", j.call.Tool)
	if span.IsRecording() {
		ctx = trace.ContextWithSpan(ctx, span)
	}
	defer func() { endSpan(span, res, "") }()
	start := time.Now()
	res = j.tool(ctx, tc)
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

// publishResult sends an encoded result in parts. A lost part loses the
// delivery (the caller fetches the result again), so the rest is not sent.
func (a *Agent) publishResult(reply, id string, data []byte, seq *atomic.Uint64) {
	parts, err := protocol.Split(data, a.chunkSize())
	if err != nil {
		data, _ = protocol.EncodeResult(protocol.ErrorResult(id, protocol.CodeTooLarge, err.Error()))
		parts = [][]byte{data}
	}
	for i, p := range parts {
		f := protocol.Frame{Kind: protocol.KindResult, CallID: id, Seq: seq.Add(1), Part: i + 1, Parts: len(parts), Data: p}
		if err := a.publish(reply, f); err != nil {
			a.log.Warn("publish result failed; it can be fetched again", "call", id, "part", i+1, "parts", len(parts), "err", err)
			return
		}
	}
}

func (a *Agent) replyResult(reply string, res *protocol.Result, seq uint64) {
	data, _ := protocol.EncodeResult(res)
	var s atomic.Uint64
	s.Store(seq)
	a.publishResult(reply, res.CallID, data, &s)
}

// replyState answers with a call's current state: a keepalive while its
// parts arrive or it runs, its result once finished.
func (a *Agent) replyState(reply, id string) {
	if seq, ok := a.pend.touch(id); ok {
		a.publishFrame(reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: id, Seq: seq})
		return
	}
	j, data := a.calls.lookup(id)
	switch {
	case j != nil:
		a.publishFrame(reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: id, Seq: j.seq.Add(1)})
	case data != nil:
		var s atomic.Uint64
		a.publishResult(reply, id, data, &s)
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

func (a *Agent) onCancel(m *nats.Msg) {
	var c protocol.Cancel
	if err := json.Unmarshal(m.Data, &c); err != nil || protocol.ValidateCallID(c.CallID) != nil {
		a.log.Warn("ignoring malformed cancel", "err", err)
		return
	}
	if a.calls.cancel(c.CallID) {
		a.log.Info("call cancelled", "call", c.CallID, "reason", c.Reason)
	}
}

func (a *Agent) onFetch(m *nats.Msg) {
	var f protocol.Fetch
	if err := json.Unmarshal(m.Data, &f); err != nil || protocol.ValidateCallID(f.CallID) != nil || m.Reply == "" {
		a.log.Warn("ignoring malformed fetch", "err", err)
		return
	}
	a.replyState(m.Reply, f.CallID)
}
