//go:build unix

package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/integration/natstest"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// assembleTest is assemble as onCall calls it, with claims for a first
// part that allow up to the agent's request limit.
func assembleTest(a *Agent, f protocol.Frame, reply string) ([]byte, string, uint64, error) {
	var claims *protocol.Claims
	if f.Part == 1 {
		claims = &protocol.Claims{CallID: f.CallID, BodySize: int64(a.cfg.MaxRequestBytes)}
	}
	data, at, err := a.assemble(f, reply, claims)
	if at == nil {
		return data, "", 0, err
	}
	return data, at.reply, at.seq, err
}

// dataOf is the encoded result a finished call keeps (nil: none).
func dataOf(f *finished) []byte {
	if f == nil {
		return nil
	}
	return f.data
}

// ctJob returns a job for call id whose cancel func counts its calls.
func ctJob(id string) (*job, *int) {
	n := new(int)
	return &job{call: &protocol.Call{ID: id}, cancel: func() { *n++ }}, n
}

func TestCallTableStartLookup(t *testing.T) {
	tab := newCallTable(time.Minute, nil)
	j, _ := ctJob("c1")
	if !tab.start(j) {
		t.Fatal("start of a new call refused")
	}
	if got, data, _ := tab.lookup("c1"); got != j || data != nil {
		t.Errorf("lookup of a running call = %v, %q; want the job", got, dataOf(data))
	}
	if got, data, dropped := tab.lookup("c2"); got != nil || data != nil || dropped {
		t.Errorf("lookup of an unknown call = %v, %q; want nothing", got, dataOf(data))
	}
	dup, _ := ctJob("c1")
	if tab.start(dup) {
		t.Error("start accepted a second call with a running call's ID")
	}
	if got, _, _ := tab.lookup("c1"); got != j {
		t.Error("a refused duplicate replaced the running job")
	}
	if n := tab.running(); n != 1 {
		t.Errorf("running() = %d, want 1", n)
	}

	t0 := time.Now()
	tab.finish("c1", []byte("result-1"), "", t0)
	if got, data, _ := tab.lookup("c1"); got != nil || string(dataOf(data)) != "result-1" {
		t.Errorf("lookup of a finished call = %v, %q; want its result", got, dataOf(data))
	}
	if n := tab.running(); n != 0 {
		t.Errorf("running() = %d after finish, want 0", n)
	}
	if snap := tab.snapshot(); len(snap) != 0 {
		t.Errorf("snapshot has %d jobs after finish", len(snap))
	}
	again, _ := ctJob("c1")
	if tab.start(again) {
		t.Error("start accepted a call whose result is still kept: it would run twice")
	}
}

func TestCallTablePruneByTTL(t *testing.T) {
	tab := newCallTable(time.Minute, nil)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, id := range []string{"a", "b", "c"} {
		j, _ := ctJob(id)
		tab.start(j)
		tab.finish(id, []byte("result-"+id), "", t0.Add(time.Duration(i)*20*time.Second))
	}
	kept := func() []string {
		var ids []string
		for _, id := range []string{"a", "b", "c", "d"} {
			if _, data, _ := tab.lookup(id); data != nil {
				ids = append(ids, id)
			}
		}
		return ids
	}
	for _, step := range []struct {
		at   time.Duration
		want []string
	}{
		{59 * time.Second, []string{"a", "b", "c"}},
		{60 * time.Second, []string{"b", "c"}}, // a expires at t0+60s
		{79 * time.Second, []string{"b", "c"}},
		{80 * time.Second, []string{"c"}},
		{99 * time.Second, []string{"c"}},
		{100 * time.Second, nil},
	} {
		tab.prune(t0.Add(step.at))
		if got := kept(); !slices.Equal(got, step.want) {
			t.Errorf("after prune at +%s kept %q, want %q", step.at, got, step.want)
		}
	}
	if tab.bytes != 0 || tab.order.Len() != 0 || len(tab.done) != 0 {
		t.Errorf("empty table still counts %d bytes, %d ordered, %d done", tab.bytes, tab.order.Len(), len(tab.done))
	}

	// finish prunes too.
	j, _ := ctJob("a")
	tab.start(j)
	tab.finish("a", []byte("x"), "", t0)
	j, _ = ctJob("d")
	tab.start(j)
	tab.finish("d", []byte("y"), "", t0.Add(2*time.Minute))
	if got := kept(); !slices.Equal(got, []string{"d"}) {
		t.Errorf("after a later finish kept %q, want only d", got)
	}
}

func TestCallTableMaxBytes(t *testing.T) {
	tab := newCallTable(time.Hour, nil)
	tab.maxBytes = 10
	now := time.Now()
	for _, id := range []string{"a", "b", "c"} {
		j, _ := ctJob(id)
		tab.start(j)
		tab.finish(id, []byte("1234"), "", now)
	}
	if _, data, _ := tab.lookup("a"); data != nil {
		t.Error("oldest result a kept although the table is over its byte limit")
	}
	for _, id := range []string{"b", "c"} {
		if _, data, _ := tab.lookup(id); string(dataOf(data)) != "1234" {
			t.Errorf("result %s = %q, want it kept", id, dataOf(data))
		}
	}
	if tab.bytes != 8 {
		t.Errorf("table counts %d bytes, want 8", tab.bytes)
	}
	j, _ := ctJob("d")
	tab.start(j)
	tab.finish("d", []byte("123456789"), "", now)
	for id, want := range map[string]bool{"b": false, "c": false, "d": true} {
		if _, data, _ := tab.lookup(id); (data != nil) != want {
			t.Errorf("after a 9-byte result: %s kept=%v, want %v", id, data != nil, want)
		}
	}
}

// A call whose result was dropped for room is still never run again: its
// ID is kept until its TTL, within a bound of its own.
func TestCallTableKeepsDroppedIDs(t *testing.T) {
	tab := newCallTable(time.Minute, nil)
	tab.maxBytes, tab.maxDropped = 10, 3
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	finish := func(id string, at time.Duration) {
		t.Helper()
		j, _ := ctJob(id)
		if !tab.start(j) {
			t.Fatalf("start of new call %s refused", id)
		}
		tab.finish(id, []byte("123456"), "", t0.Add(at))
	}
	finish("a", 0)
	finish("b", 10*time.Second) // a's result goes for room
	if _, data, dropped := tab.lookup("a"); data != nil || !dropped {
		t.Fatalf("lookup(a) after its result was dropped: kept=%v dropped=%v, want dropped", data != nil, dropped)
	}
	if _, data, dropped := tab.lookup("b"); data == nil || dropped {
		t.Errorf("lookup(b) = kept %v dropped %v, want its result", data != nil, dropped)
	}
	if again, _ := ctJob("a"); tab.start(again) {
		t.Fatal("start accepted a call whose result was dropped: it would run twice")
	}

	// Forgotten at its TTL, not before.
	tab.prune(t0.Add(59 * time.Second))
	if _, _, dropped := tab.lookup("a"); !dropped {
		t.Error("dropped ID a forgotten before its TTL")
	}
	tab.prune(t0.Add(60 * time.Second))
	if _, _, dropped := tab.lookup("a"); dropped {
		t.Error("dropped ID a still kept after its TTL")
	}
	if again, _ := ctJob("a"); !tab.start(again) {
		t.Error("an ID past its TTL cannot be used again")
	}
	tab.abandon("a")

	tab.prune(t0.Add(time.Hour))
	checkDroppedQueue(t, tab, nil)
}

// The IDs of dropped results are forgotten at their TTL, some at a
// time, and at most maxDropped are kept: the oldest go first, before
// their TTL, and the log says so once.
func TestCallTableDroppedIDsBound(t *testing.T) {
	var logged bytes.Buffer
	tab := newCallTable(time.Minute, slog.New(slog.NewTextHandler(&logged, nil)))
	tab.maxBytes, tab.maxDropped = 10, 8
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	n := 0
	finish := func(at time.Duration) {
		t.Helper()
		id := fmt.Sprintf("c%02d", n)
		n++
		j, _ := ctJob(id)
		if !tab.start(j) {
			t.Fatalf("start of new call %s refused", id)
		}
		tab.finish(id, []byte("123456"), "", t0.Add(at))
	}
	ids := func(from, to int) []string {
		var out []string
		for i := from; i < to; i++ {
			out = append(out, fmt.Sprintf("c%02d", i))
		}
		return out
	}
	// Calls c00..c06 finish a second apart; each finish drops the result
	// before it: c00..c05 are dropped, c06 is kept.
	for i := range 7 {
		finish(time.Duration(i) * time.Second)
	}
	checkDroppedQueue(t, tab, ids(0, 6))
	// c00 and c01 reach their TTL (60 s, 61 s), the rest not yet.
	tab.prune(t0.Add(61 * time.Second))
	checkDroppedQueue(t, tab, ids(2, 6))
	if tab.droppedHead == 0 {
		t.Error("the queue was compacted with less than half of it forgotten")
	}
	// Eight more at 61 s drop c06..c13: 12 IDs want keeping, so the
	// oldest four (c02..c05) go before their TTL.
	for range 8 {
		finish(61 * time.Second)
	}
	checkDroppedQueue(t, tab, ids(6, 14))
	if c := strings.Count(logged.String(), "forgotten before their TTL"); c != 1 {
		t.Errorf("the log warned %d times of IDs forgotten early, want once (at most once a minute):\n%s", c, logged.String())
	}
	for _, id := range ids(2, 6) {
		if j, _ := ctJob(id); !tab.start(j) {
			t.Errorf("%s, forgotten for room, cannot be started (the queue and the set disagree)", id)
		}
	}
	tab.prune(t0.Add(time.Hour))
	checkDroppedQueue(t, tab, nil)
}

// checkDroppedQueue checks that the table keeps exactly the dropped IDs
// want, in that order, in its set and its queue alike.
func checkDroppedQueue(t *testing.T, tab *callTable, want []string) {
	t.Helper()
	var queued []string
	for _, d := range tab.droppedList[tab.droppedHead:] {
		queued = append(queued, d.id)
	}
	if !slices.Equal(queued, want) {
		t.Errorf("dropped IDs queued = %q, want %q", queued, want)
	}
	if len(tab.dropped) != len(want) {
		t.Errorf("dropped set holds %d IDs, want %d", len(tab.dropped), len(want))
	}
	for _, id := range want {
		if _, _, dropped := tab.lookup(id); !dropped {
			t.Errorf("lookup(%s) does not report it dropped", id)
		}
		if j, _ := ctJob(id); tab.start(j) {
			t.Errorf("start accepted %s, whose result was dropped", id)
			tab.abandon(id)
		}
	}
}

func TestCallTableCancelAbandon(t *testing.T) {
	tab := newCallTable(time.Minute, nil)
	j, cancelled := ctJob("c1")
	tab.start(j)
	if !tab.cancel("c1") || *cancelled != 1 {
		t.Errorf("cancel of a running call: cancel func called %d times, want 1", *cancelled)
	}
	if tab.cancel("nope") {
		t.Error("cancel of an unknown call reports success")
	}
	tab.finish("c1", []byte("r"), "", time.Now())
	if tab.cancel("c1") {
		t.Error("cancel of a finished call reports success")
	}
	if *cancelled != 1 {
		t.Errorf("cancel func called %d times, want 1", *cancelled)
	}

	j2, c2 := ctJob("c2")
	tab.start(j2)
	tab.abandon("c2")
	if got, data, dropped := tab.lookup("c2"); got != nil || data != nil || dropped {
		t.Errorf("abandoned call still known: %v, %q", got, dataOf(data))
	}
	if *c2 != 0 {
		t.Error("abandon called the job's cancel func; the caller owns that")
	}
	j3, _ := ctJob("c2")
	if !tab.start(j3) {
		t.Error("a call that never ran cannot be started again after abandon")
	}
}

func TestAssembleSinglePart(t *testing.T) {
	a := newTestAgent(t, Config{MaxRequestBytes: 100})
	data, reply, _, err := assembleTest(a, callFrame("c1", 1, 1, `{"id":"c1"}`), "inbox.1")
	if err != nil || string(data) != `{"id":"c1"}` || reply != "inbox.1" {
		t.Errorf("assemble = %q, %q, %v", data, reply, err)
	}
	data, _, _, err = assembleTest(a, callFrame("c2", 1, 1, strings.Repeat("x", 100)), "inbox.2")
	if err != nil || len(data) != 100 {
		t.Errorf("call of exactly the limit: %d bytes, %v", len(data), err)
	}
	data, _, _, err = assembleTest(a, callFrame("c3", 1, 1, strings.Repeat("x", 101)), "inbox.3")
	if err == nil || data != nil {
		t.Fatalf("call over the limit accepted (%d bytes)", len(data))
	}
	for _, w := range []string{"101 bytes", "100 bytes", "limit"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
	if n := len(a.pend.calls); n != 0 {
		t.Errorf("single-part calls left %d pending assemblies", n)
	}
}

func TestAssembleMultiPart(t *testing.T) {
	a := newTestAgent(t, Config{MaxRequestBytes: 100})
	parts := []string{`{"id":`, `"c1",`, `"x":1}`}
	for i, p := range parts {
		// Later parts carry another reply subject; the first one counts.
		data, reply, _, err := assembleTest(a, callFrame("c1", i+1, len(parts), p), fmt.Sprintf("inbox.%d", i+1))
		if err != nil {
			t.Fatalf("part %d: %v", i+1, err)
		}
		if reply != "inbox.1" {
			t.Errorf("part %d: reply %q, want the first part's inbox.1", i+1, reply)
		}
		last := i == len(parts)-1
		if last && string(data) != strings.Join(parts, "") || !last && data != nil {
			t.Errorf("part %d: data %q", i+1, data)
		}
	}
	if n := len(a.pend.calls); n != 0 {
		t.Errorf("a complete call left %d pending assemblies", n)
	}

	// Two calls assembling at once do not mix.
	assembleTest(a, callFrame("x", 1, 2, "AA"), "ix")
	assembleTest(a, callFrame("y", 1, 2, "BB"), "iy")
	dy, ry, _, err := assembleTest(a, callFrame("y", 2, 2, "bb"), "iy")
	if err != nil || string(dy) != "BBbb" || ry != "iy" {
		t.Errorf("call y = %q, %q, %v", dy, ry, err)
	}
	dx, rx, _, err := assembleTest(a, callFrame("x", 2, 2, "aa"), "ix")
	if err != nil || string(dx) != "AAaa" || rx != "ix" {
		t.Errorf("call x = %q, %q, %v", dx, rx, err)
	}
}

func TestAssembleErrors(t *testing.T) {
	a := newTestAgent(t, Config{MaxRequestBytes: 100})

	_, reply, _, err := assembleTest(a, callFrame("c1", 2, 3, "x"), "inbox.c1")
	if err == nil || !strings.Contains(err.Error(), "without its first part") {
		t.Errorf("part 2 without part 1: %v", err)
	}
	if reply != "" {
		t.Errorf("a part without its first part is answered on %q: it belongs to no call whose envelope was checked, so nothing vouches for its reply subject", reply)
	}

	assembleTest(a, callFrame("c2", 1, 3, "a"), "inbox.c2")
	_, reply, _, err = assembleTest(a, callFrame("c2", 3, 3, "c"), "inbox.c2")
	if err == nil || !strings.Contains(err.Error(), "lost") {
		t.Errorf("gap: %v, want an error saying a part was lost", err)
	}
	if reply != "inbox.c2" {
		t.Errorf("gap error replies to %q", reply)
	}
	if _, ok := a.pend.calls["c2"]; ok {
		t.Error("a failed assembly is still pending")
	}
	if _, _, _, err := assembleTest(a, callFrame("c2", 2, 3, "b"), "inbox.c2"); err == nil {
		t.Error("a part of a failed assembly was accepted")
	}

	assembleTest(a, callFrame("c3", 1, 2, "a"), "")
	if _, _, _, err := assembleTest(a, callFrame("c3", 2, 3, "b"), ""); err == nil || !strings.Contains(err.Error(), "part count") {
		t.Errorf("changed part count: %v", err)
	}

	if _, _, _, err := assembleTest(a, callFrame("c4", 1, 2, strings.Repeat("x", 60)), ""); err != nil {
		t.Fatal(err)
	}
	data, _, _, err := assembleTest(a, callFrame("c4", 2, 2, strings.Repeat("x", 41)), "")
	if err == nil || data != nil || !strings.Contains(err.Error(), "100 bytes") {
		t.Errorf("101-byte call in parts with a 100-byte limit: %d bytes, %v", len(data), err)
	}
	if len(a.pend.calls) != 0 {
		t.Errorf("%d assemblies pending after failures, want none", len(a.pend.calls))
	}
}

func TestAssembleMaxPending(t *testing.T) {
	a := newTestAgent(t, Config{})
	for i := range maxPending {
		if _, _, _, err := assembleTest(a, callFrame(fmt.Sprintf("c%d", i), 1, 2, "a"), "r"); err != nil {
			t.Fatalf("assembly %d of %d refused: %v", i+1, maxPending, err)
		}
	}
	_, _, _, err := assembleTest(a, callFrame("one-more", 1, 2, "a"), "r")
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint(maxPending)) || !strings.Contains(err.Error(), "asm-1") {
		t.Fatalf("assembly beyond %d: %v, want a refusal naming the host and the limit", maxPending, err)
	}
	// Single-part calls are not held back by the limit.
	if data, _, _, err := assembleTest(a, callFrame("small", 1, 1, "{}"), "r"); err != nil || string(data) != "{}" {
		t.Errorf("single-part call while assemblies are full: %q, %v", data, err)
	}
	// Finishing one frees a slot.
	if data, _, _, err := assembleTest(a, callFrame("c0", 2, 2, "b"), "r"); err != nil || string(data) != "ab" {
		t.Fatalf("finishing c0: %q, %v", data, err)
	}
	if _, _, _, err := assembleTest(a, callFrame("one-more", 1, 2, "a"), "r"); err != nil {
		t.Errorf("assembly refused after a slot was freed: %v", err)
	}
}

func TestPrunePendingWithoutConnection(t *testing.T) {
	a := newTestAgent(t, Config{})
	assembleTest(a, callFrame("old", 1, 2, "a"), "inbox.old")
	assembleTest(a, callFrame("new", 1, 2, "a"), "inbox.new")
	now := time.Now()
	a.pend.calls["old"].started = now.Add(-pendingTimeout - time.Second)
	a.prunePending(now) // no NATS connection: nothing to reply on, no panic
	if _, ok := a.pend.calls["old"]; ok {
		t.Error("stale assembly kept")
	}
	if _, ok := a.pend.calls["new"]; !ok {
		t.Error("fresh assembly pruned")
	}
	if _, _, _, err := assembleTest(a, callFrame("old", 2, 2, "b"), "inbox.old"); err == nil {
		t.Error("a late part of a pruned call was accepted")
	}
}

// The end-to-end tests below run the Agent against a real NATS server and
// talk to it with plain NATS messages, as a gateway does.

func startTestNATS(t *testing.T) *server.Server {
	t.Helper()
	return startTestNATSWith(t, nil)
}

// startTestNATSWith starts a NATS server whose options mod may adjust.
func startTestNATSWith(t *testing.T, mod func(*server.Options)) *server.Server {
	t.Helper()
	opts := &server.Options{}
	if mod != nil {
		mod(opts)
	}
	return natstest.Start(t, opts)
}

// runAgent runs an agent with cfg until stop (or the end of the test).
// stop cancels it and fails the test unless Run returns within 10 s.
func runAgent(t *testing.T, ns *server.Server, cfg Config) (stop func()) {
	t.Helper()
	r := startAgent(t, ns, cfg, nil)
	return func() {
		r.cancel()
		r.wait(t, 10*time.Second)
	}
}

// watchedNATS starts a test NATS server and a connection to it that
// hears every host's announces (closed when the test ends).
func watchedNATS(t *testing.T) (*server.Server, *nats.Conn, <-chan *nats.Msg) {
	t.Helper()
	ns := startTestNATS(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return ns, nc, presence(t, nc)
}

// presence subscribes to every host's announces.
func presence(t *testing.T, nc *nats.Conn) <-chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 256)
	if _, err := nc.ChanSubscribe(protocol.PresenceWildcard(), ch); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// nextAnnounce returns host's next announce with the given Leaving flag.
func nextAnnounce(t *testing.T, ch <-chan *nats.Msg, host string, leaving bool) protocol.Announce {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-ch:
			var a protocol.Announce
			if err := json.Unmarshal(m.Data, &a); err != nil {
				t.Fatalf("announce on %s is not JSON: %v", m.Subject, err)
			}
			if m.Subject != protocol.PresenceSubject(a.Host) {
				t.Errorf("announce of %q on subject %s", a.Host, m.Subject)
			}
			if a.Host == host && a.Leaving == leaving {
				return a
			}
		case <-deadline:
			t.Fatalf("no announce of %s with leaving=%v within 10s", host, leaving)
		}
	}
}

// exchange is one request to an agent and the frames it answered with.
type exchange struct {
	sub *nats.Subscription
	// maxBody, when set, is the largest message body the agent may send.
	maxBody int
}

// sendCall sends call as a gateway does, signed, in one part when it
// fits.
func sendCall(t *testing.T, nc *nats.Conn, call protocol.Call) exchange {
	t.Helper()
	x := newExchange(t, nc)
	publishFrames(t, nc, call.Host, x.sub.Subject, callFrames(t, call, x.sub.Subject, 0))
	return x
}

// newExchange subscribes a fresh reply inbox.
func newExchange(t *testing.T, nc *nats.Conn) exchange {
	t.Helper()
	sub, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return exchange{sub: sub}
}

func sendFetch(t *testing.T, nc *nats.Conn, host, id string) exchange {
	t.Helper()
	data, _ := json.Marshal(protocol.Fetch{CallID: id})
	x := newExchange(t, nc)
	h := nats.Header{protocol.HeaderAuth: {envelope(protocol.MsgFetch, host, id, "", x.sub.Subject, data, 0, protocol.CallerClaims{})}}
	if err := nc.PublishMsg(&nats.Msg{Subject: protocol.FetchSubject(host), Reply: x.sub.Subject, Header: h, Data: data}); err != nil {
		t.Fatal(err)
	}
	return x
}

// next returns the next frame.
func (x exchange) next(t *testing.T, within time.Duration) protocol.Frame {
	t.Helper()
	m, err := x.sub.NextMsg(within)
	if err != nil {
		t.Fatalf("no frame within %s: %v", within, err)
	}
	if x.maxBody > 0 && len(m.Data) > x.maxBody {
		t.Errorf("frame of %d bytes; the limit is %d", len(m.Data), x.maxBody)
	}
	f, err := protocol.DecodeFrame(m.Header, m.Data)
	if err != nil {
		t.Fatalf("agent sent a bad frame: %v", err)
	}
	return f
}

// result collects frames until a complete result and returns it with the
// output that streamed before it.
func (x exchange) result(t *testing.T, id string) (*protocol.Result, string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var out strings.Builder
	var asm *protocol.Assembly
	for {
		f := x.next(t, time.Until(deadline))
		if f.CallID != id {
			t.Errorf("frame for call %q on the inbox of call %q", f.CallID, id)
		}
		switch f.Kind {
		case protocol.KindOutput:
			out.Write(f.Data)
		case protocol.KindResult:
			if f.Part == 1 {
				asm = protocol.NewAssembly(0)
			}
			if asm == nil {
				t.Fatalf("result part %d/%d without part 1", f.Part, f.Parts)
			}
			done, err := asm.Add(f)
			if err != nil {
				t.Fatal(err)
			}
			if !done {
				continue
			}
			res, err := protocol.DecodeResult(asm.Bytes())
			if err != nil {
				t.Fatalf("undecodable result: %v", err)
			}
			if res.CallID != id {
				t.Errorf("result names call %q, want %q", res.CallID, id)
			}
			return res, out.String()
		}
	}
}

func newCall(host, id, tool string, args any) protocol.Call {
	raw, _ := json.Marshal(args)
	return protocol.Call{ID: id, Protocol: protocol.Version, Host: host, Tool: tool,
		Caller: protocol.Caller{Subject: "tester"}, TimeoutMS: 30000, Args: raw}
}

func resultText(t *testing.T, res *protocol.Result) string {
	t.Helper()
	if res.Error != nil {
		t.Fatalf("result carries error %v", res.Error)
	}
	if len(res.Content) != 1 || res.Content[0].Type != "text" {
		t.Fatalf("result content %+v, want one text", res.Content)
	}
	return res.Content[0].Text
}

func wantCode(t *testing.T, res *protocol.Result, code protocol.Code, mentions ...string) {
	t.Helper()
	if res.Error == nil || res.Error.Code != code {
		t.Fatalf("result %+v, want error code %s", res, code)
	}
	for _, m := range mentions {
		if !strings.Contains(res.Error.Message, m) {
			t.Errorf("error %q does not mention %q", res.Error.Message, m)
		}
	}
}

func TestAgentEndToEnd(t *testing.T) {
	const host = "e2e-1"
	ns, nc, pres := watchedNATS(t)
	cwd := t.TempDir()
	stop := runAgent(t, ns, Config{Name: host, Cwd: cwd, MaxConcurrent: 4})

	a := nextAnnounce(t, pres, host, false)
	if a.Protocol != protocol.Version || a.OS != runtime.GOOS || a.Arch != runtime.GOARCH || a.Cwd != cwd ||
		a.Labels != nil || a.Limit != 4 || a.HeartbeatMS != 5000 || a.AgentVersion != Version || a.StartedAt.IsZero() {
		t.Errorf("announce = %+v", a)
	}
	for _, tool := range []string{"read", "write", "edit", "bash"} {
		if !slices.Contains(a.Tools, tool) {
			t.Errorf("announce tools %q lack %s", a.Tools, tool)
		}
	}
	if !isInstanceID(a.Instance) {
		t.Errorf("announce instance %q, want 16 hex digits", a.Instance)
	}
	if err := nc.Publish(protocol.DiscoverSubject(), nil); err != nil {
		t.Fatal(err)
	}
	if again := nextAnnounce(t, pres, host, false); again.Instance != a.Instance {
		t.Errorf("a later announce names instance %q, the first one %q", again.Instance, a.Instance)
	}

	t.Run("bash", func(t *testing.T) {
		res, out := sendCall(t, nc, newCall(host, "echo-1", "bash", map[string]string{"command": "echo hi"})).result(t, "echo-1")
		if text := resultText(t, res); text != "hi\n" || res.IsError {
			t.Errorf("echo hi = %q (error %v), want %q", text, res.IsError, "hi\n")
		}
		if out != "hi\n" {
			t.Errorf("streamed output %q, want %q", out, "hi\n")
		}
	})

	t.Run("repeated call is not run again", func(t *testing.T) {
		call := newCall(host, "append-1", "bash", map[string]string{"command": "echo run >> runs.txt; echo appended"})
		first, _ := sendCall(t, nc, call).result(t, call.ID)
		if text := resultText(t, first); text != "appended\n" {
			t.Fatalf("first run = %q", text)
		}
		again, _ := sendCall(t, nc, call).result(t, call.ID)
		if text := resultText(t, again); text != "appended\n" || again.IsError != first.IsError {
			t.Errorf("repeated call answered %q, want the stored result", text)
		}
		fetched, _ := sendFetch(t, nc, host, call.ID).result(t, call.ID)
		if text := resultText(t, fetched); text != "appended\n" {
			t.Errorf("fetch answered %q, want the stored result", text)
		}
		if data, err := os.ReadFile(filepath.Join(cwd, "runs.txt")); err != nil || string(data) != "run\n" {
			t.Errorf("runs.txt = %q (%v): the command ran more than once", data, err)
		}
	})

	t.Run("repeated call while running", func(t *testing.T) {
		call := newCall(host, "slow-1", "bash", map[string]string{"command": "sleep 0.5; echo run >> slow.txt"})
		first := sendCall(t, nc, call)
		second := sendCall(t, nc, call)
		if f := second.next(t, 5*time.Second); f.Kind != protocol.KindKeepalive || f.CallID != call.ID {
			t.Errorf("repeat of a running call answered %s for %s, want a keepalive", f.Kind, f.CallID)
		}
		fetch := sendFetch(t, nc, host, call.ID)
		if f := fetch.next(t, 5*time.Second); f.Kind != protocol.KindKeepalive {
			t.Errorf("fetch of a running call answered %s, want a keepalive", f.Kind)
		}
		if res, _ := first.result(t, call.ID); res.Error != nil || res.IsError {
			t.Fatalf("slow call = %+v", res)
		}
		if data, err := os.ReadFile(filepath.Join(cwd, "slow.txt")); err != nil || string(data) != "run\n" {
			t.Errorf("slow.txt = %q (%v): the command ran more than once", data, err)
		}
	})

	t.Run("fetch of an unknown call", func(t *testing.T) {
		res, _ := sendFetch(t, nc, host, "never-sent").result(t, "never-sent")
		wantCode(t, res, protocol.CodeUnknownCall, host, "never-sent")
	})

	t.Run("wrong protocol version", func(t *testing.T) {
		call := newCall(host, "v99", "bash", map[string]string{"command": "echo must-not-run >> v99.txt"})
		call.Protocol = 99
		res, _ := sendCall(t, nc, call).result(t, call.ID)
		wantCode(t, res, protocol.CodeVersion, "99", fmt.Sprint(protocol.Version))
		if _, err := os.Stat(filepath.Join(cwd, "v99.txt")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a call of another protocol version ran: %v", err)
		}
	})

	t.Run("unknown tool", func(t *testing.T) {
		res, _ := sendCall(t, nc, newCall(host, "frob-1", "frob", map[string]string{})).result(t, "frob-1")
		wantCode(t, res, protocol.CodeUnknownTool, `"frob"`, "bash, delete, edit, list, move, patch, read, search, skill, task_cancel, task_list, task_status, write")
	})

	t.Run("call for another host", func(t *testing.T) {
		refused := refusals(t, nc, host)
		call := newCall("other", "other-1", "bash", map[string]string{"command": "true"})
		x := newExchange(t, nc)
		publishFrames(t, nc, host, x.sub.Subject, callFrames(t, call, x.sub.Subject, 0))
		r := nextRefusal(t, refused)
		if r.Reason != protocol.RefusedWrongHost || r.CallID != "other-1" || !strings.Contains(r.Message, "other") {
			t.Errorf("a call re-targeted at %s: refusal %+v", host, r)
		}
		if m, err := x.sub.NextMsg(200 * time.Millisecond); err == nil {
			t.Errorf("a re-targeted call was answered: %s", m.Data)
		}
	})

	t.Run("call ID differs from frame ID", func(t *testing.T) {
		call := newCall(host, "inner-1", "bash", map[string]string{"command": "true"})
		data, _ := json.Marshal(call)
		x := newExchange(t, nc)
		call.ID = "outer-1" // what the envelope signs: the frame's id, with the body as it is
		frames := callFrames(t, call, x.sub.Subject, 0)
		frames[0].Data = data
		frames[0].Auth = envelope(protocol.MsgCall, host, "outer-1", "bash", x.sub.Subject, data, call.TimeoutMS, call.Caller.Claims())
		publishFrames(t, nc, host, x.sub.Subject, frames)
		res, _ := x.result(t, "outer-1")
		wantCode(t, res, protocol.CodeBadRequest, "inner-1", "outer-1")
	})

	t.Run("call in parts", func(t *testing.T) {
		call := newCall(host, "parts-1", "bash", map[string]string{"command": "echo " + strings.Repeat("p", 100<<10) + " | wc -c"})
		x := newExchange(t, nc)
		parts := callFrames(t, call, x.sub.Subject, 16<<10)
		if len(parts) < 2 {
			t.Fatalf("%d parts", len(parts))
		}
		publishFrames(t, nc, host, x.sub.Subject, parts)
		res, _ := x.result(t, call.ID)
		if text := strings.TrimSpace(resultText(t, res)); text != fmt.Sprint(100<<10+1) {
			t.Errorf("call in %d parts printed %q, want %d", len(parts), text, 100<<10+1)
		}
	})

	stop()
	if left := nextAnnounce(t, pres, host, true); left.Host != host || left.Instance != a.Instance {
		t.Errorf("leaving announce %+v; want host %s, instance %s", left, host, a.Instance)
	}
}

// A call whose kept result was dropped for room is answered
// result_dropped when sent again or fetched, and never run again.
func TestAgentDroppedResultNotRunAgain(t *testing.T) {
	const host = "drop-1"
	ns, nc, pres := watchedNATS(t)
	cwd := t.TempDir()
	// A limit of one byte: every result is dropped as soon as it is sent.
	startAgent(t, ns, Config{Name: host, Cwd: cwd}, func(a *Agent) { a.calls.maxBytes = 1 })
	nextAnnounce(t, pres, host, false)

	call := newCall(host, "append-1", "bash", map[string]string{"command": "echo run >> runs.txt; echo appended"})
	first, _ := sendCall(t, nc, call).result(t, call.ID)
	if text := resultText(t, first); text != "appended\n" {
		t.Fatalf("first run = %q", text)
	}
	again, _ := sendCall(t, nc, call).result(t, call.ID)
	wantCode(t, again, protocol.CodeResultDropped, host, call.ID, "no longer keeps its result")
	fetched, _ := sendFetch(t, nc, host, call.ID).result(t, call.ID)
	wantCode(t, fetched, protocol.CodeResultDropped, host, call.ID)
	if data, err := os.ReadFile(filepath.Join(cwd, "runs.txt")); err != nil || string(data) != "run\n" {
		t.Errorf("runs.txt = %q (%v): the command ran more than once", data, err)
	}
}

func TestAgentBusy(t *testing.T) {
	const host = "busy-1"
	ns, nc, pres := watchedNATS(t)
	stop := runAgent(t, ns, Config{Name: host, MaxConcurrent: 1, MaxQueue: -1})
	nextAnnounce(t, pres, host, false)

	first := sendCall(t, nc, newCall(host, "sleep-1", "bash", map[string]string{"command": "sleep 1"}))
	second := sendCall(t, nc, newCall(host, "sleep-2", "bash", map[string]string{"command": "sleep 1"}))
	r2, _ := second.result(t, "sleep-2")
	r1, _ := first.result(t, "sleep-1")
	busy := 0
	for _, r := range []*protocol.Result{r1, r2} {
		switch {
		case r.Error != nil && r.Error.Code == protocol.CodeBusy:
			busy++
			for _, w := range []string{host, "busy"} {
				if !strings.Contains(r.Error.Message, w) {
					t.Errorf("busy error %q does not mention %q", r.Error.Message, w)
				}
			}
		case r.Error == nil && !r.IsError:
		default:
			t.Errorf("call %s = %+v, want success or busy", r.CallID, r)
		}
	}
	if busy != 1 {
		t.Errorf("%d of two concurrent calls were refused as busy with one worker and no queue, want exactly 1", busy)
	}
	if r1.Error != nil {
		t.Errorf("the first call was refused (%v) although the worker was free", r1.Error)
	}

	// The refused call was never recorded: sent again once the worker is
	// free, it runs.
	again, _ := sendCall(t, nc, newCall(host, "sleep-2", "bash", map[string]string{"command": "echo second"})).result(t, "sleep-2")
	if text := resultText(t, again); text != "second\n" {
		t.Errorf("refused call sent again = %q, want it run", text)
	}
	stop()
	nextAnnounce(t, pres, host, true)
}

// TestAgentNotBusyAfterAnswer: with one worker and no queue, a call sent
// as soon as the one before it was answered is taken, even while the
// worker that answered is still on its way back to the queue.
func TestAgentNotBusyAfterAnswer(t *testing.T) {
	const host = "busy-2"
	ns, nc, pres := watchedNATS(t)
	ran, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r := startAgent(t, ns, Config{Name: host, MaxConcurrent: 1, MaxQueue: -1}, func(a *Agent) {
		a.afterRun = func() {
			once.Do(func() {
				close(ran)
				<-release
			})
		}
	})
	nextAnnounce(t, pres, host, false)

	first, _ := sendCall(t, nc, newCall(host, "one", "bash", map[string]string{"command": "echo one"})).result(t, "one")
	if text := resultText(t, first); text != "one\n" {
		t.Fatalf("first call = %q", text)
	}
	<-ran // the worker has answered and not taken the next call yet
	second := sendCall(t, nc, newCall(host, "two", "bash", map[string]string{"command": "echo two"}))
	for deadline := time.Now().Add(10 * time.Second); len(r.a.queue) == 0; time.Sleep(5 * time.Millisecond) {
		if n, _, _ := second.sub.Pending(); n > 0 {
			res, _ := second.result(t, "two")
			close(release)
			t.Fatalf("the call sent after the answer was refused: %+v", res.Error)
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("the second call was neither taken in nor refused within 10 s")
		}
	}
	close(release)
	res, _ := second.result(t, "two")
	if text := resultText(t, res); text != "two\n" {
		t.Errorf("second call = %q, want it run", text)
	}
}

// TestDiscoveryFloodOneAnnounce: discovery requests are not signed, so
// anyone on the account may send many; a flood of them makes one
// announce at a time, not one each (nor a timer each).
func TestDiscoveryFloodOneAnnounce(t *testing.T) {
	const host = "disc-1"
	ns, nc, pres := watchedNATS(t)
	stop := runAgent(t, ns, Config{Name: host, Cwd: t.TempDir(), Heartbeat: time.Hour})
	defer stop()
	nextAnnounce(t, pres, host, false)
	for range 2000 {
		if err := nc.Publish(protocol.DiscoverSubject(), nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The flood's answer, then quiet: at most a couple more while the
	// flood was still arriving.
	nextAnnounce(t, pres, host, false)
	n := 1
	quiet := time.After(time.Second)
	for done := false; !done; {
		select {
		case <-pres:
			n++
		case <-quiet:
			done = true
		}
	}
	if n > 5 {
		t.Errorf("2000 discovery requests made %d announces; want one at a time", n)
	}
}
