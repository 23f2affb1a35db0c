package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/integration/natstest"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/gwtest"
)

// waitFor bounds every wait in these tests.
const waitFor = 5 * time.Second

// startNATS runs a NATS server on a random loopback port until the test
// ends. maxPayload 0 keeps the server's default.
func startNATS(t *testing.T, maxPayload int32) *server.Server {
	t.Helper()
	return natstest.Start(t, &server.Options{MaxPayload: maxPayload})
}

// connectNATS connects to ns as name (gwtest.Connect).
func connectNATS(t *testing.T, ns *server.Server, name string) *nats.Conn {
	return gwtest.Connect(t, ns.ClientURL(), name)
}

// newTestRouter returns a router on its own connection to ns, with a
// registry in which host is online.
func newTestRouter(t *testing.T, ns *server.Server, host string, silence time.Duration) (*router, *registry) {
	t.Helper()
	reg := newRegistry(discardLogger(), time.Minute, nil)
	if host != "" {
		announce(t, reg, announceOf(host))
		if h, ok := reg.get(host); !ok || !h.Online {
			t.Fatalf("host %s is not online after announcing", host)
		}
	}
	nc := connectNATS(t, ns, "gateway")
	r, err := newRouter(nc, reg, discardLogger(), silence, nil, nil, testGatewayKey(), testHostKey, newHostBounds(time.Now, time.Hour), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	return r, reg
}

// receivedCall is a complete call as the fake agent assembled it.
type receivedCall struct {
	call  protocol.Call
	raw   []byte           // the assembled JSON
	parts []protocol.Frame // the KindCall frames it came in
	reply string
}

type receivedFetch struct {
	fetch protocol.Fetch
	reply string
	auth  string
}

type receivedCancel struct {
	protocol.Cancel
	auth string
}

// fakeAgent plays an agent with plain subscriptions on the host's
// subjects. It assembles calls and hands them, with every cancel and fetch,
// to the test, which decides what to answer. Its subscription callbacks
// only fill channels; problems are reported when the test ends.
type fakeAgent struct {
	host    string
	nc      *nats.Conn
	calls   chan receivedCall
	cancels chan receivedCancel
	fetches chan receivedFetch
	errs    chan error
	asm     map[string]*receivedCall // only touched by the call callback
	asms    map[string]*protocol.Assembly
}

// newFakeAgent subscribes to host's call, cancel and fetch subjects.
func newFakeAgent(t *testing.T, ns *server.Server, host string) *fakeAgent {
	t.Helper()
	fa := &fakeAgent{
		host:    host,
		calls:   make(chan receivedCall, 16),
		cancels: make(chan receivedCancel, 16),
		fetches: make(chan receivedFetch, 64),
		errs:    make(chan error, 64),
		asm:     make(map[string]*receivedCall),
		asms:    make(map[string]*protocol.Assembly),
	}
	t.Cleanup(func() {
		for {
			select {
			case err := <-fa.errs:
				t.Errorf("fake agent %s: %v", host, err)
			default:
				return
			}
		}
	})
	fa.nc = connectNATS(t, ns, "fake agent "+host)
	for subject, h := range map[string]nats.MsgHandler{
		protocol.CallSubject(host):   fa.onCall,
		protocol.CancelSubject(host): fa.onCancel,
		protocol.FetchSubject(host):  fa.onFetch,
	} {
		if _, err := fa.nc.Subscribe(subject, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := fa.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return fa
}

func (fa *fakeAgent) fail(format string, args ...any) {
	select {
	case fa.errs <- fmt.Errorf(format, args...):
	default:
	}
}

func (fa *fakeAgent) onCall(m *nats.Msg) {
	f, err := protocol.DecodeFrame(protocol.Header(m.Header), m.Data)
	if err != nil || f.Kind != protocol.KindCall {
		fa.fail("call message on %s is not a call frame: %+v, %v", m.Subject, f, err)
		return
	}
	if m.Reply == "" {
		fa.fail("call %s part %d has no reply subject", f.CallID, f.Part)
		return
	}
	rc, a := fa.asm[f.CallID], fa.asms[f.CallID]
	if rc == nil {
		rc = &receivedCall{reply: m.Reply}
		a = protocol.NewAssembly(0)
		fa.asm[f.CallID], fa.asms[f.CallID] = rc, a
	}
	if m.Reply != rc.reply {
		fa.fail("call %s part %d replies to %q, part 1 to %q", f.CallID, f.Part, m.Reply, rc.reply)
	}
	rc.parts = append(rc.parts, f)
	done, err := a.Add(f)
	if err != nil {
		fa.fail("assemble call: %v", err)
		delete(fa.asm, f.CallID)
		return
	}
	if !done {
		return
	}
	delete(fa.asm, f.CallID)
	delete(fa.asms, f.CallID)
	rc.raw = a.Bytes()
	if err := json.Unmarshal(rc.raw, &rc.call); err != nil {
		fa.fail("call %s is not JSON: %v", f.CallID, err)
		return
	}
	fa.calls <- *rc
}

func (fa *fakeAgent) onCancel(m *nats.Msg) {
	var c protocol.Cancel
	if err := json.Unmarshal(m.Data, &c); err != nil {
		fa.fail("cancel is not JSON: %v", err)
		return
	}
	fa.cancels <- receivedCancel{Cancel: c, auth: m.Header.Get(protocol.HeaderAuth)}
}

func (fa *fakeAgent) onFetch(m *nats.Msg) {
	var f protocol.Fetch
	if err := json.Unmarshal(m.Data, &f); err != nil {
		fa.fail("fetch is not JSON: %v", err)
		return
	}
	if m.Reply == "" {
		fa.fail("fetch for %s has no reply subject", f.CallID)
	}
	fa.fetches <- receivedFetch{fetch: f, reply: m.Reply, auth: m.Header.Get(protocol.HeaderAuth)}
}

// send publishes one frame to reply.
func (fa *fakeAgent) send(t *testing.T, reply string, f protocol.Frame) {
	t.Helper()
	h, body := f.Encode()
	if err := fa.nc.PublishMsg(&nats.Msg{Subject: reply, Header: nats.Header(h), Data: body}); err != nil {
		t.Fatalf("publish %s frame: %v", f.Kind, err)
	}
}

// resultFrames encodes res as KindResult frames of at most chunk bytes,
// numbered from seq+1.
func resultFrames(t *testing.T, host string, res *protocol.Result, chunk int, seq uint64) []protocol.Frame {
	t.Helper()
	data, err := protocol.EncodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	parts, err := protocol.Split(data, chunk)
	if err != nil {
		t.Fatal(err)
	}
	frames := make([]protocol.Frame, len(parts))
	for i, p := range parts {
		frames[i] = protocol.Frame{Kind: protocol.KindResult, CallID: res.CallID, Seq: seq + uint64(i) + 1, Part: i + 1, Parts: len(parts), Data: p}
	}
	frames[len(frames)-1].Receipt = testReceipt(t, host, res, data)
	return frames
}

// sendResult publishes res to reply in one part.
func (fa *fakeAgent) sendResult(t *testing.T, reply string, res *protocol.Result) {
	t.Helper()
	for _, f := range resultFrames(t, fa.host, res, 1<<20, 0) {
		fa.send(t, reply, f)
	}
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("no %s within %s", what, waitFor)
		panic("unreachable")
	}
}

// callOutcome is what router.call returned, with the frames it passed to
// the frame callback.
type callOutcome struct {
	res    *protocol.Result
	err    error
	frames []protocol.Frame
	took   time.Duration
}

// startCall runs r.call on its own goroutine. Every frame the callback
// sees is also sent to live, when live is not nil.
func startCall(ctx context.Context, r *router, req callRequest, live chan<- protocol.Frame) <-chan callOutcome {
	out := make(chan callOutcome, 1)
	go func() {
		var frames []protocol.Frame
		start := time.Now()
		res, err := r.call(ctx, req, func(f protocol.Frame) {
			frames = append(frames, f)
			if live != nil {
				live <- f
			}
		})
		out <- callOutcome{res: res, err: err, frames: frames, took: time.Since(start)}
	}()
	return out
}

func bashCall(host, command string) callRequest {
	args, _ := json.Marshal(map[string]string{"host": host, "command": command})
	return callRequest{Host: host, Tool: "bash", Caller: protocol.Caller{Subject: "user-1", Name: "Ada"}, Args: args, Timeout: time.Minute}
}

func wantText(t *testing.T, res *protocol.Result, want string) {
	t.Helper()
	if res == nil || res.Error != nil || len(res.Content) != 1 || res.Content[0].Text != want {
		t.Fatalf("result = %+v, want the text %.40q", res, want)
	}
}

func wantHostError(t *testing.T, err error, kind HostErrorKind, mentions ...string) *HostError {
	t.Helper()
	var he *HostError
	if !errors.As(err, &he) {
		t.Fatalf("error %v (%T), want a *HostError of kind %d", err, err, kind)
	}
	if he.Kind != kind {
		t.Errorf("HostError kind %d (%q), want %d", he.Kind, he.Msg, kind)
	}
	for _, m := range mentions {
		if !strings.Contains(he.Msg, m) {
			t.Errorf("HostError %q does not mention %q", he.Msg, m)
		}
	}
	return he
}

func TestRouterPlainResult(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 2*time.Second)
	fa := newFakeAgent(t, ns, "web-1")

	req := bashCall("web-1", "echo hi")
	done := startCall(context.Background(), r, req, nil)
	rc := recv(t, fa.calls, "call")
	c := rc.call
	if c.Protocol != protocol.Version || c.Host != "web-1" || c.Tool != "bash" || !reflect.DeepEqual(c.Caller, req.Caller) ||
		c.TimeoutMS != time.Minute.Milliseconds() || !bytes.Equal(c.Args, req.Args) {
		t.Errorf("agent received %+v, want the request %+v", c, req)
	}
	if err := protocol.ValidateCallID(c.ID); err != nil {
		t.Errorf("call ID: %v", err)
	}
	if len(rc.parts) != 1 || rc.parts[0].CallID != c.ID || rc.parts[0].Seq != 1 {
		t.Errorf("call came as %d parts (first %+v), want one part with the call's ID", len(rc.parts), rc.parts[0])
	}
	if !strings.HasPrefix(rc.reply, protocol.GatewayInboxPrefix()+".") || !strings.HasSuffix(rc.reply, "."+c.Host) {
		t.Errorf("reply subject %q is not a gateway inbox for host %s", rc.reply, c.Host)
	}
	fa.sendResult(t, rc.reply, &protocol.Result{CallID: c.ID, Content: []protocol.Content{protocol.Text("hi\n")}})
	out := recv(t, done, "call result")
	if out.err != nil {
		t.Fatal(out.err)
	}
	wantText(t, out.res, "hi\n")
	if out.res.CallID != c.ID {
		t.Errorf("result call ID %q, want %q", out.res.CallID, c.ID)
	}
	if len(out.frames) != 0 {
		t.Errorf("frame callback saw %d frames, want none", len(out.frames))
	}

	// A second call gets a new ID.
	done = startCall(context.Background(), r, req, nil)
	rc2 := recv(t, fa.calls, "second call")
	if rc2.call.ID == c.ID {
		t.Errorf("two calls share the ID %s", c.ID)
	}
	fa.sendResult(t, rc2.reply, &protocol.Result{CallID: rc2.call.ID, IsError: true, Content: []protocol.Content{protocol.Text("failed")}})
	if out := recv(t, done, "second result"); out.err != nil || !out.res.IsError {
		t.Errorf("second call = %+v, %v; want the tool error", out.res, out.err)
	}
}

func TestRouterFramesInOrder(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 2*time.Second)
	fa := newFakeAgent(t, ns, "web-1")

	done := startCall(context.Background(), r, bashCall("web-1", "make"), nil)
	rc := recv(t, fa.calls, "call")
	id := rc.call.ID
	sent := []protocol.Frame{
		{Kind: protocol.KindOutput, CallID: id, Seq: 1, Data: []byte("compiling\n")},
		{Kind: protocol.KindKeepalive, CallID: id, Seq: 2},
		{Kind: protocol.KindProgress, CallID: id, Seq: 3, Data: []byte("50%")},
		{Kind: protocol.KindOutput, CallID: id, Seq: 4, Data: []byte("linking\n")},
		{Kind: protocol.KindKeepalive, CallID: id, Seq: 5},
	}
	for i := 6; i < 60; i++ {
		sent = append(sent, protocol.Frame{Kind: protocol.KindOutput, CallID: id, Seq: uint64(i), Data: fmt.Appendf(nil, "line %d\n", i)})
	}
	for _, f := range sent {
		fa.send(t, rc.reply, f)
	}
	fa.send(t, rc.reply, resultFrames(t, "web-1", &protocol.Result{CallID: id, Content: []protocol.Content{protocol.Text("done")}}, 1<<20, uint64(len(sent)))[0])
	out := recv(t, done, "call result")
	if out.err != nil {
		t.Fatal(out.err)
	}
	wantText(t, out.res, "done")
	if len(out.frames) != len(sent) {
		t.Fatalf("frame callback saw %d frames, want %d", len(out.frames), len(sent))
	}
	for i, f := range out.frames {
		w := sent[i]
		if f.Kind != w.Kind || f.Seq != w.Seq || f.CallID != id || string(f.Data) != string(w.Data) {
			t.Errorf("frame %d = %s seq %d %q, want %s seq %d %q", i, f.Kind, f.Seq, f.Data, w.Kind, w.Seq, w.Data)
		}
	}
}

// bigText returns n bytes of text that differ along their length, so that
// reordered or repeated parts show.
func bigText(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%07d ", i)
	}
	return b.String()[:n]
}

func TestRouterMultiPartResult(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 2*time.Second)
	fa := newFakeAgent(t, ns, "web-1")

	done := startCall(context.Background(), r, bashCall("web-1", "cat big"), nil)
	rc := recv(t, fa.calls, "call")
	text := bigText(200 << 10)
	png := bytes.Repeat([]byte{0x89, 'P', 'N', 'G', 0}, 5000)
	frames := resultFrames(t, "web-1", &protocol.Result{CallID: rc.call.ID, Content: []protocol.Content{
		protocol.Text(text), {Type: "image", MIMEType: "image/png", Data: png},
	}, Structured: json.RawMessage(`{"lines":1}`)}, protocol.ChunkSize, 0)
	if len(frames) < 5 {
		t.Fatalf("result splits into %d parts, want several", len(frames))
	}
	// Output between result parts is passed on too.
	fa.send(t, rc.reply, frames[0])
	fa.send(t, rc.reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: rc.call.ID, Seq: 1000})
	for _, f := range frames[1:] {
		fa.send(t, rc.reply, f)
	}
	out := recv(t, done, "call result")
	if out.err != nil {
		t.Fatal(out.err)
	}
	res := out.res
	if len(res.Content) != 2 || res.Content[0].Text != text || !bytes.Equal(res.Content[1].Data, png) ||
		res.Content[1].MIMEType != "image/png" || string(res.Structured) != `{"lines":1}` {
		t.Errorf("multi-part result came back changed: %d items", len(res.Content))
	}
	if len(out.frames) != 1 || out.frames[0].Kind != protocol.KindKeepalive {
		t.Errorf("frame callback saw %+v, want the one keepalive", out.frames)
	}
}

// TestRouterFetchesLostResultParts loses part 2 of a 3-part result: the
// router must ask the agent again with a Fetch and take the full result it
// answers with.
func TestRouterFetchesLostResultParts(t *testing.T) {
	const silence = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		send []int // parts of the first delivery, 1-based
	}{
		{"later part arrives", []int{1, 3}}, // the gap shows at once
		{"nothing after part 1", []int{1}},  // only silence shows it
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := startNATS(t, 0)
			r, _ := newTestRouter(t, ns, "web-1", silence)
			fa := newFakeAgent(t, ns, "web-1")

			done := startCall(context.Background(), r, bashCall("web-1", "cat file"), nil)
			rc := recv(t, fa.calls, "call")
			text := bigText(100 << 10)
			frames := resultFrames(t, "web-1", &protocol.Result{CallID: rc.call.ID, Content: []protocol.Content{protocol.Text(text)}}, 40<<10, 0)
			if len(frames) != 3 {
				t.Fatalf("result has %d parts, want 3", len(frames))
			}
			for _, p := range tc.send {
				fa.send(t, rc.reply, frames[p-1])
			}
			fetch := recv(t, fa.fetches, "fetch after a lost result part")
			if fetch.fetch.CallID != rc.call.ID {
				t.Errorf("fetch names call %q, want %q", fetch.fetch.CallID, rc.call.ID)
			}
			if fetch.reply != rc.reply {
				t.Errorf("fetch replies to %q, want the call's inbox %q", fetch.reply, rc.reply)
			}
			for _, f := range frames {
				fa.send(t, fetch.reply, f)
			}
			out := recv(t, done, "call result")
			if out.err != nil {
				t.Fatal(out.err)
			}
			wantText(t, out.res, text)
			select {
			case c := <-fa.cancels:
				t.Errorf("router cancelled a call that succeeded: %+v", c)
			default:
			}
		})
	}
}

// TestRouterLateResultPartsDoNotRefetch delivers a result whose part 2 is
// lost and whose later parts keep trickling in after the router has asked
// for the result again. Those stragglers belong to the broken delivery that
// the fetch already replaces: they must neither cost further fetches (each
// makes the agent send the whole result again) nor use up the re-fetch
// budget and fail a call that one fetch recovers.
func TestRouterLateResultPartsDoNotRefetch(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 2*time.Second)
	fa := newFakeAgent(t, ns, "web-1")

	live := make(chan protocol.Frame, 64)
	done := startCall(context.Background(), r, bashCall("web-1", "cat file"), live)
	rc := recv(t, fa.calls, "call")
	id := rc.call.ID
	text := bigText(64 << 10)
	frames := resultFrames(t, "web-1", &protocol.Result{CallID: id, Content: []protocol.Content{protocol.Text(text)}}, 8<<10, 0)
	if len(frames) != 9 {
		t.Fatalf("result has %d parts, want 9", len(frames))
	}
	fa.send(t, rc.reply, frames[0])
	fa.send(t, rc.reply, frames[2])
	first := recv(t, fa.fetches, "fetch after the gap")

	// Each straggler is followed by an output frame. The router has dealt
	// with the straggler once that output reaches the frame callback, or
	// once a fetch comes out of it.
	extra := 0
	for i := 3; i < len(frames); i++ {
		mark := fmt.Sprintf("after part %d", i+1)
		fa.send(t, rc.reply, frames[i])
		fa.send(t, rc.reply, protocol.Frame{Kind: protocol.KindOutput, CallID: id, Seq: 100 + uint64(i), Data: []byte(mark)})
	wait:
		for {
			select {
			case f := <-live:
				if string(f.Data) == mark {
					break wait
				}
			case <-fa.fetches:
				extra++
				break wait
			case out := <-done:
				t.Fatalf("call ended while stale parts of a replaced delivery were arriving (%d extra fetches): %v", extra, out.err)
			case <-time.After(waitFor):
				t.Fatalf("router did nothing with stale part %d", i+1)
			}
		}
	}
	for _, f := range frames {
		fa.send(t, first.reply, f)
	}
	out := recv(t, done, "call result")
	if out.err != nil {
		t.Fatalf("call failed after %d extra fetches: %v", extra, out.err)
	}
	wantText(t, out.res, text)
	if err := r.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := fa.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	extra += len(fa.fetches)
	if extra > 0 {
		t.Errorf("stale parts of a result already being fetched again caused %d more fetches, want none", extra)
	}
}

// TestRouterSilentHost: an agent that takes the call and then says nothing
// is asked for the call's state, and the call fails as silent about
// 2 × silence after it was sent.
func TestRouterSilentHost(t *testing.T) {
	const silence = 300 * time.Millisecond
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", silence)
	fa := newFakeAgent(t, ns, "web-1")

	done := startCall(context.Background(), r, bashCall("web-1", "sleep 100"), nil)
	rc := recv(t, fa.calls, "call")
	out := recv(t, done, "call failure")
	wantHostError(t, out.err, HostSilent, "web-1", "silent", "bash")
	if out.res != nil {
		t.Errorf("a failed call returned a result: %+v", out.res)
	}
	if lo, hi := 2*silence, 2*silence+2*time.Second; out.took < lo-10*time.Millisecond || out.took > hi {
		t.Errorf("silent host detected after %s, want about %s (at most %s)", out.took, lo, hi)
	}
	if f := recv(t, fa.fetches, "fetch"); f.fetch.CallID != rc.call.ID {
		t.Errorf("fetch for %q, want %q", f.fetch.CallID, rc.call.ID)
	}
	c := recv(t, fa.cancels, "cancel of the silent call")
	if c.CallID != rc.call.ID || !strings.Contains(c.Reason, "silent") {
		t.Errorf("cancel = %+v, want call %s cancelled as silent", c, rc.call.ID)
	}
	// One fetch per half silence period until it gives up: 300 and 450 ms.
	if n := len(fa.fetches); n > 2 {
		t.Errorf("router fetched %d more times; at most 2 more are expected", n)
	}
}

// TestRouterKeepalivesHoldOffSilence: a call that only sends keepalives is
// never declared silent.
func TestRouterKeepalivesHoldOffSilence(t *testing.T) {
	// Keepalives come at a quarter of the silence period, so a loaded
	// machine (race detector, CI) cannot stretch a gap past it.
	const silence = time.Second
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", silence)
	fa := newFakeAgent(t, ns, "web-1")

	live := make(chan protocol.Frame, 64)
	done := startCall(context.Background(), r, bashCall("web-1", "sleep 1"), live)
	rc := recv(t, fa.calls, "call")
	// Keepalives every silence/4 for 2 × silence, each sent once the
	// router has passed the previous one on.
	for seq := uint64(1); seq <= 8; seq++ {
		fa.send(t, rc.reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: rc.call.ID, Seq: seq})
		recv(t, live, "keepalive")
		select {
		case out := <-done:
			t.Fatalf("call ended while keepalives arrived: %v", out.err)
		case <-time.After(silence / 4):
		}
	}
	fa.sendResult(t, rc.reply, &protocol.Result{CallID: rc.call.ID})
	if out := recv(t, done, "result"); out.err != nil {
		t.Fatal(out.err)
	}
	if n := len(fa.fetches); n != 0 {
		t.Errorf("router fetched %d times while keepalives arrived", n)
	}
}

func TestRouterCallTimeout(t *testing.T) {
	const silence = 300 * time.Millisecond
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", silence)
	fa := newFakeAgent(t, ns, "web-1")

	req := bashCall("web-1", "sleep 100")
	req.Timeout = 100 * time.Millisecond
	done := startCall(context.Background(), r, req, nil)
	rc := recv(t, fa.calls, "call")
	out := recv(t, done, "call failure")
	wantHostError(t, out.err, HostTimeout, "bash", "web-1", "100ms")
	c := recv(t, fa.cancels, "cancel of the timed-out call")
	if c.CallID != rc.call.ID || !strings.Contains(c.Reason, "deadline") {
		t.Errorf("cancel = %+v, want call %s cancelled for its deadline", c, rc.call.ID)
	}
}

// TestRouterNoResponders: with no agent subscribed, NATS answers "no
// responders"; the call waits rejoinGrace for the agent to come back,
// asking meanwhile, then fails, well before the silence timeout.
func TestRouterNoResponders(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 10*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	res, err := r.call(ctx, bashCall("web-1", "true"), nil)
	took := time.Since(start)
	wantHostError(t, err, HostGone, "web-1", "not connected")
	if res != nil {
		t.Errorf("result %+v from a host nobody serves", res)
	}
	if took < rejoinGrace || took > rejoinGrace+3*time.Second {
		t.Errorf("no-responders failure took %s, want just over the %s the call waits for its agent", took, rejoinGrace)
	}
}

// TestRouterAwaitsRejoin: a call sent while its host's agent is away (a
// reconnection) waits for it. The agent, back, is asked about the call:
// when it has no record of it, the call is sent again and answered once;
// when it has it (a keepalive), it is not sent again.
func TestRouterAwaitsRejoin(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 10*time.Second)
	done := startCall(context.Background(), r, bashCall("web-1", "echo back"), nil)
	time.Sleep(3 * rejoinProbe) // some probes find nobody listening
	fa := newFakeAgent(t, ns, "web-1")
	fetch := recv(t, fa.fetches, "a fetch asking whether the agent has the call")
	fa.sendResult(t, fetch.reply, protocol.ErrorResult(fetch.fetch.CallID, protocol.CodeUnknownCall, "host web-1 has no record of call "+fetch.fetch.CallID))
	rc := recv(t, fa.calls, "the call, sent again")
	if rc.call.ID != fetch.fetch.CallID {
		t.Fatalf("sent again as call %s, asked about %s", rc.call.ID, fetch.fetch.CallID)
	}
	fa.sendResult(t, rc.reply, &protocol.Result{CallID: rc.call.ID, Content: []protocol.Content{protocol.Text("back\n")}})
	out := recv(t, done, "the result")
	if out.err != nil {
		t.Fatal(out.err)
	}
	wantText(t, out.res, "back\n")
	select {
	case again := <-fa.calls:
		t.Errorf("the call was sent once more: %+v", again.call)
	case <-time.After(2 * rejoinProbe):
	}

	// comeBack sends a call while old's connection is gone, and returns
	// it with the agent that then comes back and the fetch that asks it.
	comeBack := func(old *fakeAgent, command, which string) (<-chan callOutcome, *fakeAgent, receivedFetch) {
		t.Helper()
		old.nc.Close()
		waitUntil(t, "the agent's connection gone from the server", func() bool { return ns.NumClients() == 1 })
		done := startCall(context.Background(), r, bashCall("web-1", command), nil)
		time.Sleep(2 * rejoinProbe) // some probes find nobody listening
		fa := newFakeAgent(t, ns, "web-1")
		return done, fa, recv(t, fa.fetches, "a fetch, "+which)
	}

	// An agent that has the call after all answers the probe with a
	// keepalive: the call is not sent again and runs to its result.
	done, fa, fetch = comeBack(fa, "echo kept", "second call")
	fa.send(t, fetch.reply, protocol.Frame{Kind: protocol.KindKeepalive, CallID: fetch.fetch.CallID, Seq: 1})
	select {
	case again := <-fa.calls:
		t.Fatalf("a call its agent keeps was sent again: %+v", again.call)
	case <-time.After(3 * rejoinProbe):
	}
	fa.sendResult(t, fetch.reply, &protocol.Result{CallID: fetch.fetch.CallID, Content: []protocol.Content{protocol.Text("kept\n")}})
	if out := recv(t, done, "the second result"); out.err != nil {
		t.Fatal(out.err)
	} else {
		wantText(t, out.res, "kept\n")
	}

	// An agent that ran the call but dropped its result for room answers
	// result_dropped: the call ends with that answer and is not sent again.
	done, fa, fetch = comeBack(fa, "echo dropped", "third call")
	fa.sendResult(t, fetch.reply, protocol.ErrorResult(fetch.fetch.CallID, protocol.CodeResultDropped, "host web-1 ran call "+fetch.fetch.CallID+", but no longer keeps its result"))
	out = recv(t, done, "the third call's end")
	if out.err != nil || out.res == nil || out.res.Error == nil || out.res.Error.Code != protocol.CodeResultDropped {
		t.Fatalf("a result_dropped answer ended the call with %+v, %v; want that answer", out.res, out.err)
	}
	select {
	case again := <-fa.calls:
		t.Errorf("a call whose agent ran it was sent again: %+v", again.call)
	case <-time.After(3 * rejoinProbe):
	}
}

// TestRouterHostNotCallable: unknown, invalid and offline hosts fail before
// anything is sent.
func TestRouterHostNotCallable(t *testing.T) {
	ns := startNATS(t, 0)
	r, reg := newTestRouter(t, ns, "web-1", time.Second)
	leaving := announceOf("gone-1")
	leaving.Leaving = true
	announce(t, reg, leaving)
	announce(t, reg, announceOf("quiet-1"))

	sniffer := connectNATS(t, ns, "sniffer")
	seen, err := sniffer.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := sniffer.Flush(); err != nil {
		t.Fatal(err)
	}
	before := r.nc.Stats().OutMsgs

	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	for _, tc := range []struct {
		host     string
		kind     HostErrorKind
		mentions []string
	}{
		{"nope-1", HostUnknown, []string{"unknown host", `"nope-1"`, "hosts"}},
		{"bad.host", HostUnknown, []string{"invalid host", "bad.host"}},
		{"", HostUnknown, []string{"invalid host"}},
		{"web-*", HostUnknown, []string{"invalid host"}},
		{"gone-1", HostOffline, []string{`"gone-1"`, "offline", "hosts"}},
	} {
		res, err := r.call(ctx, bashCall(tc.host, "true"), nil)
		if res != nil {
			t.Errorf("call to %q returned a result %+v", tc.host, res)
		}
		if he := wantHostError(t, err, tc.kind, tc.mentions...); he.Host != tc.host {
			t.Errorf("HostError.Host = %q, want %q", he.Host, tc.host)
		}
	}
	// quiet-1 misses its heartbeats: the registry's clock moves on.
	reg.now = func() time.Time { return time.Now().Add(2 * time.Minute) }
	_, err = r.call(ctx, bashCall("quiet-1", "true"), nil)
	wantHostError(t, err, HostOffline, `"quiet-1"`, "offline")

	if after := r.nc.Stats().OutMsgs; after != before {
		t.Errorf("router published %d messages for calls that should never leave the gateway", after-before)
	}
	// Order holds per connection: if anything had been published, it
	// would reach the sniffer before this marker.
	if err := r.nc.Publish("test.marker", nil); err != nil {
		t.Fatal(err)
	}
	m, err := seen.NextMsg(waitFor)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "test.marker" {
		t.Errorf("NATS saw %q before the marker; calls to uncallable hosts must not be sent", m.Subject)
	}
}

func TestRouterCancel(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 5*time.Second)
	fa := newFakeAgent(t, ns, "web-1")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := startCall(ctx, r, bashCall("web-1", "sleep 100"), nil)
	rc := recv(t, fa.calls, "call")
	cancel()
	out := recv(t, done, "cancelled call")
	if !errors.Is(out.err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", out.err)
	}
	if out.took > 2*time.Second {
		t.Errorf("cancel took %s to end the call", out.took)
	}
	c := recv(t, fa.cancels, "protocol.Cancel")
	if c.CallID != rc.call.ID || c.Reason == "" {
		t.Errorf("agent got cancel %+v, want one for call %s with a reason", c, rc.call.ID)
	}
	// A result that arrives after the caller left goes nowhere, harmlessly.
	fa.sendResult(t, rc.reply, &protocol.Result{CallID: rc.call.ID})
	if err := fa.nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// TestRouterSplitsLargeCall sends a 1 MiB argument through a server whose
// max_payload is 64 KiB: the call must arrive in several parts that
// reassemble to the original.
func TestRouterSplitsLargeCall(t *testing.T) {
	ns := startNATS(t, 64<<10)
	r, _ := newTestRouter(t, ns, "web-1", 5*time.Second)
	if got := r.nc.MaxPayload(); got != 64<<10 {
		t.Fatalf("server max_payload is %d, want 64 KiB", got)
	}
	fa := newFakeAgent(t, ns, "web-1")

	args, err := json.Marshal(map[string]string{"host": "web-1", "path": "/tmp/big", "content": bigText(1 << 20)})
	if err != nil {
		t.Fatal(err)
	}
	req := callRequest{Host: "web-1", Tool: "write", Caller: protocol.Caller{Subject: "u"}, Args: args, Timeout: time.Minute}
	done := startCall(context.Background(), r, req, nil)
	rc := recv(t, fa.calls, "large call")
	n := len(rc.parts)
	if n < 2 {
		t.Fatalf("1 MiB call arrived in %d part", n)
	}
	for i, p := range rc.parts {
		if p.Part != i+1 || p.Parts != n || p.Seq != uint64(i+1) || p.CallID != rc.call.ID {
			t.Errorf("part %d: %d/%d seq %d call %s, want %d/%d seq %d call %s", i, p.Part, p.Parts, p.Seq, p.CallID, i+1, n, i+1, rc.call.ID)
		}
		if int64(len(p.Data)) > r.nc.MaxPayload() {
			t.Errorf("part %d carries %d bytes, over max_payload", i+1, len(p.Data))
		}
	}
	whole := protocol.NewAssembly(0)
	for _, p := range rc.parts {
		if _, err := whole.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	var c protocol.Call
	if err := json.Unmarshal(whole.Bytes(), &c); err != nil {
		t.Fatalf("reassembled call is not JSON: %v", err)
	}
	if !bytes.Equal(c.Args, args) || c.Tool != "write" || c.Host != "web-1" {
		t.Errorf("reassembled call differs from the request (args %d bytes, want %d)", len(c.Args), len(args))
	}
	fa.sendResult(t, rc.reply, &protocol.Result{CallID: rc.call.ID, Content: []protocol.Content{protocol.Text("wrote 1 MiB")}})
	out := recv(t, done, "result")
	if out.err != nil {
		t.Fatal(out.err)
	}
	wantText(t, out.res, "wrote 1 MiB")
}

// TestRouterRejectsForeignResult: a result that names another call is not
// taken as this call's answer.
func TestRouterRejectsForeignResult(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 5*time.Second)
	fa := newFakeAgent(t, ns, "web-1")
	done := startCall(context.Background(), r, bashCall("web-1", "true"), nil)
	rc := recv(t, fa.calls, "call")
	res := &protocol.Result{CallID: "other-call"}
	for _, f := range resultFrames(t, "web-1", res, 1<<20, 0) {
		f.CallID = rc.call.ID
		fa.send(t, rc.reply, f)
	}
	out := recv(t, done, "result")
	wantHostError(t, out.err, HostUnreachable, "other-call")
}

// Calls to one host share its reply subject; frames find their call by
// the call ID they carry, and a frame on one host's subject never reaches
// another host's call.
func TestRouterRepliesPerHost(t *testing.T) {
	ns := startNATS(t, 0)
	r, reg := newTestRouter(t, ns, "web-1", 2*time.Second)
	announce(t, reg, announceOf("web-2"))
	fa1, fa2 := newFakeAgent(t, ns, "web-1"), newFakeAgent(t, ns, "web-2")

	first := startCall(context.Background(), r, bashCall("web-1", "one"), nil)
	rc1 := recv(t, fa1.calls, "first call")
	second := startCall(context.Background(), r, bashCall("web-1", "two"), nil)
	rc2 := recv(t, fa1.calls, "second call")
	other := startCall(context.Background(), r, bashCall("web-2", "three"), nil)
	rc3 := recv(t, fa2.calls, "call to web-2")
	if rc1.reply != rc2.reply || rc1.reply == rc3.reply {
		t.Errorf("reply subjects %q, %q (web-1) and %q (web-2): want one per host", rc1.reply, rc2.reply, rc3.reply)
	}
	// web-2 answers web-1's first call on its own subject: ignored.
	fa2.sendResult(t, rc3.reply, &protocol.Result{CallID: rc1.call.ID, Content: []protocol.Content{protocol.Text("forged")}})
	// Answers in the other order than the calls.
	fa1.sendResult(t, rc2.reply, &protocol.Result{CallID: rc2.call.ID, Content: []protocol.Content{protocol.Text("two")}})
	fa1.sendResult(t, rc1.reply, &protocol.Result{CallID: rc1.call.ID, Content: []protocol.Content{protocol.Text("one")}})
	fa2.sendResult(t, rc3.reply, &protocol.Result{CallID: rc3.call.ID, Content: []protocol.Content{protocol.Text("three")}})
	for _, c := range []struct {
		out  <-chan callOutcome
		want string
	}{{first, "one"}, {second, "two"}, {other, "three"}} {
		o := recv(t, c.out, "outcome")
		if o.err != nil {
			t.Fatalf("%s: %v", c.want, o.err)
		}
		wantText(t, o.res, c.want)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.calls) != 0 || len(r.byHost) != 0 {
		t.Errorf("finished calls still tracked: %d calls, %d hosts", len(r.calls), len(r.byHost))
	}
}
