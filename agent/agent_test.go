//go:build unix

package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

func isInstanceID(s string) bool {
	if len(s) != 16 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func TestInstancePerProcess(t *testing.T) {
	a, b := newTestAgent(t, Config{}), newTestAgent(t, Config{})
	for _, id := range []string{a.instance, b.instance} {
		if !isInstanceID(id) {
			t.Errorf("instance %q, want 16 hex digits", id)
		}
	}
	if a.instance == b.instance {
		t.Errorf("two agents share instance %q", a.instance)
	}
}

func TestBackoffCeiling(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		attempt int
		lo, hi  time.Duration
		want    time.Duration
	}{
		{1, 500 * ms, 30 * time.Second, 500 * ms},
		{2, 500 * ms, 30 * time.Second, time.Second},
		{3, 500 * ms, 30 * time.Second, 2 * time.Second},
		{7, 500 * ms, 30 * time.Second, 30 * time.Second}, // 32 s capped
		{1000000, 500 * ms, 30 * time.Second, 30 * time.Second},
		{0, 500 * ms, 30 * time.Second, 500 * ms},
		{5, 50 * ms, 500 * ms, 500 * ms},
		{3, 0, time.Second, 4 * ms},           // lo at least 1 ms
		{3, time.Second, 0, time.Second},      // hi at least lo
		{80, time.Hour, 1<<63 - 1, 1<<63 - 1}, // no overflow
	}
	for _, tt := range tests {
		if got := backoffCeiling(tt.attempt, tt.lo, tt.hi); got != tt.want {
			t.Errorf("backoffCeiling(%d, %s, %s) = %s, want %s", tt.attempt, tt.lo, tt.hi, got, tt.want)
		}
	}
}

func TestReconnectDelay(t *testing.T) {
	const lo, hi, n = 500 * time.Millisecond, 30 * time.Second, 2000
	prevMax := time.Duration(0)
	for attempt := 1; attempt <= 8; attempt++ {
		ceiling := backoffCeiling(attempt, lo, hi)
		minSeen, maxSeen := time.Duration(1<<63-1), time.Duration(0)
		distinct := map[time.Duration]bool{}
		for range n {
			d := reconnectDelay(attempt, lo, hi)
			if d < 0 || d > ceiling {
				t.Fatalf("attempt %d: delay %s outside [0, %s]", attempt, d, ceiling)
			}
			minSeen, maxSeen = min(minSeen, d), max(maxSeen, d)
			distinct[d] = true
		}
		// Full jitter: the delays cover the whole range, so agents cut off
		// together spread out.
		if minSeen > ceiling/10 || maxSeen < ceiling*9/10 || len(distinct) < n/2 {
			t.Errorf("attempt %d: %d delays span %s..%s with %d distinct values; want them spread over 0..%s",
				attempt, n, minSeen, maxSeen, len(distinct), ceiling)
		}
		if maxSeen < prevMax && ceiling < hi {
			t.Errorf("attempt %d: longest delay %s shrank from %s", attempt, maxSeen, prevMax)
		}
		prevMax = maxSeen
	}
}

// Commands never see the agent's own variables, such as its NATS
// password, whatever the agent's environment holds.
func TestNewKeepsAgentVariablesFromCommands(t *testing.T) {
	t.Setenv("FLEET_NATS_PASSWORD", "s3cret")
	t.Setenv("FLEET_NATS_URL", "nats://example:4222")
	t.Setenv("FLEETMCP_TEST_KEPT", "kept")
	a := newTestAgent(t, Config{})
	args, _ := json.Marshal(map[string]string{"command": "env"})
	res := a.served().tools["bash"](context.Background(), &toolCall{ID: "env-1", Args: args, Output: func([]byte) {}})
	text := resultText(t, res)
	if strings.Contains(text, "FLEET_") || strings.Contains(text, "s3cret") {
		t.Errorf("a command saw the agent's variables:\n%s", text)
	}
	if !strings.Contains(text, "FLEETMCP_TEST_KEPT=kept") {
		t.Errorf("a command did not inherit the rest of the environment:\n%s", text)
	}
}

// testRun is an Agent running in a test.
type testRun struct {
	a      *Agent
	cancel context.CancelFunc // starts the drain
	done   chan error
}

// startAgent runs an agent with cfg until the end of the test. setup, when
// not nil, may adjust the Agent before it runs.
func startAgent(t *testing.T, ns *server.Server, cfg Config, setup func(*Agent)) *testRun {
	t.Helper()
	cfg.Servers = []string{ns.ClientURL()}
	cfg.StateDir = t.TempDir()
	if cfg.GatewayKeys == nil {
		cfg.GatewayKeys = testGatewayKeys()
	}
	if cfg.Cwd == "" {
		cfg.Cwd = t.TempDir()
	}
	cfg.Logger = quietLogger()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	trackInstance(t, a)
	if setup != nil {
		setup(a)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &testRun{a: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		r.wait(t, 10*time.Second)
	})
	return r
}

// wait fails the test unless Run returns (nil) within d. It may be called
// more than once.
func (r *testRun) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		if err != nil {
			t.Errorf("Run returned %v", err)
		}
	case <-time.After(d):
		t.Errorf("Run did not return within %s of its context ending", d)
	}
}

// connectTest connects a plain NATS client, as a gateway would.
func connectTest(t *testing.T, ns *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func sendCancel(t *testing.T, nc *nats.Conn, host, id string) {
	t.Helper()
	data, _ := json.Marshal(protocol.Cancel{CallID: id, Reason: "test"})
	h := nats.Header{protocol.HeaderAuth: {envelope(protocol.MsgCancel, host, id, "", "", data, 0, protocol.CallerClaims{})}}
	if err := nc.PublishMsg(&nats.Msg{Subject: protocol.CancelSubject(host), Header: h, Data: data}); err != nil {
		t.Fatal(err)
	}
}

// waitOutput reads x's frames until output containing want has arrived.
func (x exchange) waitOutput(t *testing.T, want string) {
	t.Helper()
	var out strings.Builder
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), want) {
		if f := x.next(t, time.Until(deadline)); f.Kind == protocol.KindOutput {
			out.Write(f.Data)
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// While it drains, the agent still hears cancels and fetches, and answers
// new calls with a refusal.
func TestDrainKeepsSession(t *testing.T) {
	const host = "drain-1"
	ns := startTestNATS(t)
	nc := connectTest(t, ns)
	pres := presence(t, nc)
	r := startAgent(t, ns, Config{Name: host, DrainTimeout: time.Minute}, nil)
	nextAnnounce(t, pres, host, false)

	first := sendCall(t, nc, newCall(host, "long-1", "bash", map[string]string{"command": "echo started; sleep 30"}))
	second := sendCall(t, nc, newCall(host, "long-2", "bash", map[string]string{"command": "echo started; sleep 30"}))
	first.waitOutput(t, "started")
	second.waitOutput(t, "started")
	r.cancel()
	waitUntil(t, "drain begins", r.a.draining.Load)

	late, _ := sendCall(t, nc, newCall(host, "late-1", "bash", map[string]string{"command": "echo must-not-run"})).result(t, "late-1")
	wantCode(t, late, protocol.CodeShuttingDown, host)

	start := time.Now()
	sendCancel(t, nc, host, "long-1")
	res, _ := first.result(t, "long-1")
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("result of a call cancelled during the drain took %s", took)
	}
	if text := resultText(t, res); !res.IsError || !strings.HasSuffix(text, "Command cancelled") {
		t.Errorf("cancelled call = %q (error %v), want it cancelled", text, res.IsError)
	}
	// A result that finished during the drain can be fetched again.
	fetched, _ := sendFetch(t, nc, host, "long-1").result(t, "long-1")
	if text := resultText(t, fetched); !strings.HasSuffix(text, "Command cancelled") {
		t.Errorf("fetch during the drain = %q, want the stored result", text)
	}

	sendCancel(t, nc, host, "long-2")
	if res, _ := second.result(t, "long-2"); !res.IsError {
		t.Errorf("second cancelled call = %+v", res)
	}
	r.wait(t, 5*time.Second) // nothing left to drain
	nextAnnounce(t, pres, host, true)
}

// A call that ignores its cancellation does not keep the agent from
// leaving, and its caller gets an answer.
func TestDrainBounded(t *testing.T) {
	const host = "stuck-1"
	ns := startTestNATS(t)
	nc := connectTest(t, ns)
	pres := presence(t, nc)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	r := startAgent(t, ns, Config{Name: host, DrainTimeout: 200 * time.Millisecond}, func(a *Agent) {
		a.cancelGrace = 300 * time.Millisecond
		a.served().tools["stuck"] = func(ctx context.Context, tc *toolCall) *protocol.Result {
			started <- struct{}{}
			<-release // ignores ctx
			return toolText(tc, "late")
		}
	})
	t.Cleanup(func() { close(release) }) // runs before the agent is stopped
	nextAnnounce(t, pres, host, false)

	x := sendCall(t, nc, newCall(host, "stuck-call", "stuck", map[string]string{}))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck tool did not start")
	}
	start := time.Now()
	r.cancel()
	res, _ := x.result(t, "stuck-call")
	wantCode(t, res, protocol.CodeCancelled, host, "stuck-call", "did not stop")
	r.wait(t, 5*time.Second)
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Run took %s to return with a stuck call; want about DrainTimeout + grace", took)
	}
	nextAnnounce(t, pres, host, true)
}

// Output and results fit the server's max_payload when it is below
// protocol.ChunkSize.
func TestSmallMaxPayload(t *testing.T) {
	const host, maxPayload = "small-1", 8 << 10
	ns := startTestNATSWith(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	nc := connectTest(t, ns)
	pres := presence(t, nc)
	runAgent(t, ns, Config{Name: host})
	nextAnnounce(t, pres, host, false)

	x := sendCall(t, nc, newCall(host, "big-out", "bash", map[string]string{"command": "head -c 40000 /dev/zero | tr '\\0' x"}))
	x.maxBody = maxPayload
	res, out := x.result(t, "big-out")
	want := strings.Repeat("x", 40000)
	if text := resultText(t, res); text != want {
		t.Errorf("result of %d bytes, want the %d bytes of output", len(text), len(want))
	}
	if out != want {
		t.Errorf("streamed %d bytes of output, want %d", len(out), len(want))
	}
}

func TestChunkSize(t *testing.T) {
	ns := startTestNATSWith(t, func(o *server.Options) { o.MaxPayload = 8 << 10 })
	a := newTestAgent(t, Config{})
	if got := a.chunkSize(); got != protocol.ChunkSize {
		t.Errorf("chunk size without a connection = %d, want %d", got, protocol.ChunkSize)
	}
	a.nc.Store(connectTest(t, ns))
	if got := a.chunkSize(); got != 7<<10 {
		t.Errorf("chunk size under an 8 KiB max_payload = %d, want 7 KiB", got)
	}
	tiny := startTestNATSWith(t, func(o *server.Options) { o.MaxPayload = 1500 })
	a.nc.Store(connectTest(t, tiny))
	if got := a.chunkSize(); got != 1<<10 {
		t.Errorf("chunk size under a 1500-byte max_payload = %d, want the 1 KiB floor", got)
	}
}

// A call whose parts are still arriving is alive: it gets keepalives, and
// a fetch for it does not call it unknown.
func TestPendingCallKeepalive(t *testing.T) {
	const host = "pend-1"
	ns := startTestNATS(t)
	nc := connectTest(t, ns)
	pres := presence(t, nc)
	runAgent(t, ns, Config{Name: host, Keepalive: 50 * time.Millisecond})
	nextAnnounce(t, pres, host, false)

	call := newCall(host, "parts-2", "bash", map[string]string{"command": "echo assembled"})
	data, _ := json.Marshal(call)
	inbox, err := nc.SubscribeSync(nats.NewInbox())
	if err != nil {
		t.Fatal(err)
	}
	x := exchange{sub: inbox}
	parts := callFrames(t, call, inbox.Subject, len(data)/2+1)
	if len(parts) != 2 {
		t.Fatalf("split into %d parts", len(parts))
	}
	sendPart := func(x exchange, i int) {
		publishFrames(t, nc, host, x.sub.Subject, parts[i:i+1])
	}
	sendPart(x, 0)

	var lastSeq uint64
	for range 2 {
		f := x.next(t, 5*time.Second)
		if f.Kind != protocol.KindKeepalive || f.CallID != call.ID || f.Seq <= lastSeq {
			t.Fatalf("while parts arrive the call's inbox got %s for %s seq %d, want keepalives with rising seq", f.Kind, f.CallID, f.Seq)
		}
		lastSeq = f.Seq
	}
	fetch := sendFetch(t, nc, host, call.ID)
	if f := fetch.next(t, 5*time.Second); f.Kind != protocol.KindKeepalive || f.CallID != call.ID {
		t.Fatalf("fetch of a call whose parts are arriving answered %s (%s), want a keepalive", f.Kind, f.Data)
	}

	// The call's own frames continue the keepalives' numbering.
	sendPart(x, 1)
	for {
		f := x.next(t, 10*time.Second)
		if f.Seq <= lastSeq {
			t.Errorf("%s frame has seq %d, not after the keepalives' %d", f.Kind, f.Seq, lastSeq)
		}
		if f.Kind == protocol.KindResult {
			break
		}
	}
}

// A result that cannot be sent is worth a warning; a lost output frame is
// not.
func TestPublishFailureLogLevels(t *testing.T) {
	a := newTestAgent(t, Config{}) // never connected
	var log strings.Builder
	a.log = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var seq atomic.Uint64
	a.publishFrame("inbox.out", protocol.Frame{Kind: protocol.KindOutput, CallID: "c1", Seq: seq.Add(1), Data: []byte("x")})
	if log.Len() != 0 {
		t.Errorf("a lost output frame was logged above debug:\n%s", log.String())
	}
	a.replyResult("inbox.res", protocol.ErrorResult("c1", protocol.CodeBusy, "busy"), seq.Load())
	if got := log.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "call=c1") {
		t.Errorf("a lost result was not logged as a warning naming the call:\n%s", got)
	}
}
