package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// logTally is a slog handler that counts what the gateway logs (at info
// and above, as it runs by default) and forwards warnings to the test log.
type logTally struct {
	t     testing.TB
	mu    sync.Mutex
	lines int
	bytes int
}

func (l *logTally) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelInfo }
func (l *logTally) WithAttrs([]slog.Attr) slog.Handler            { return l }
func (l *logTally) WithGroup(string) slog.Handler                 { return l }
func (l *logTally) Handle(_ context.Context, r slog.Record) error {
	var b bytes.Buffer
	_ = slog.NewTextHandler(&b, nil).Handle(context.Background(), r)
	l.mu.Lock()
	l.lines++
	l.bytes += b.Len()
	l.mu.Unlock()
	if r.Level >= slog.LevelWarn {
		l.t.Log(b.String()[:min(b.Len(), 300)])
	}
	return nil
}

func (l *logTally) take() (lines, bytes int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines, bytes = l.lines, l.bytes
	l.lines, l.bytes = 0, 0
	return lines, bytes
}

// rogueAgent is a raw NATS connection with a valid agent credential: what
// an attacker who stole one host's credential can do, without the agent's
// own checks.
func rogueAgent(t *testing.T, env *Env, host string) *nats.Conn {
	t.Helper()
	nc, err := env.AgentConn(host)
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestRogueAnnounces: one agent credential cannot make the gateway hold
// much memory or write much log, whatever it announces: 300 announces with
// a different 900 KB cwd, 100 with a 900 KB host field and 20,000
// malformed messages leave the gateway's heap where it was and cost a few
// log lines; afterwards the credential's host is listed normally.
func TestRogueAnnounces(t *testing.T) {
	tally := &logTally{t: t}
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) { c.Logger = slog.New(tally) }})
	nc := rogueAgent(t, env, "rogue")
	subject := protocol.PresenceSubject("rogue")
	valid := func(cwd string) []byte {
		data, _ := json.Marshal(protocol.Announce{Host: "rogue", Instance: "r1", Protocol: protocol.Version, OS: "linux", Arch: "amd64",
			Cwd: cwd, Shell: "/bin/sh", HeartbeatMS: 60000})
		return data
	}
	// settled publishes a valid announce naming marker and waits until the
	// gateway has taken it: it has then handled everything published
	// before (NATS keeps one publisher's order).
	settled := func(marker string) {
		t.Helper()
		if err := nc.Publish(subject, valid(marker)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "the gateway to take the marker announce", func() bool {
			h, ok := env.Gateway.Host("rogue")
			return ok && h.Cwd == marker
		})
	}
	settled("/start")
	tally.take()
	before := heapInUse()

	huge := strings.Repeat("x", 900<<10)
	for i := range 300 {
		a := protocol.Announce{Host: "rogue", Instance: "r1", Protocol: protocol.Version, Cwd: fmt.Sprintf("/%d%s", i, huge), HeartbeatMS: 60000}
		data, _ := json.Marshal(a)
		if err := nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
	}
	settled("/after-cwd")
	grown := heapInUse() - before
	lines, logged := tally.take()
	t.Logf("300 announces with a 900 KB cwd: gateway heap %+.1f MiB, %d log lines, %d bytes", float64(grown)/(1<<20), lines, logged)
	if grown > 32<<20 {
		t.Errorf("300 announces with a 900 KB cwd grew the heap by %.0f MiB", float64(grown)/(1<<20))
	}
	if lines > 3 || logged > 4<<10 {
		t.Errorf("300 refused announces logged %d lines, %d bytes", lines, logged)
	}

	hostField, _ := json.Marshal(protocol.Announce{Host: huge, Protocol: protocol.Version})
	for range 100 {
		if err := nc.Publish(subject, hostField); err != nil {
			t.Fatal(err)
		}
	}
	malformed := [][]byte{[]byte(`{"host":"rogue","cwd":` + strings.Repeat("1", 2000)), []byte("not json"), {}, []byte(`{"host":["rogue"]}`)}
	for i := range 20000 {
		if err := nc.Publish(subject, malformed[i%len(malformed)]); err != nil {
			t.Fatal(err)
		}
	}
	settled("/after-malformed")
	lines, logged = tally.take()
	t.Logf("100 announces with a 900 KB host and 20,000 malformed ones: %d log lines, %d bytes", lines, logged)
	if lines > 3 || logged > 4<<10 {
		t.Errorf("20,100 refused messages logged %d lines, %d bytes; want a line a minute per agent", lines, logged)
	}
	if h, _ := env.Gateway.Host("rogue"); !h.Online || h.Cwd != "/after-malformed" {
		t.Errorf("after the flood the host is %+v", h)
	}
}

// rogueHost is a rogue agent that announces itself and answers every call
// with answer, which sends frames through send. It holds the host's key
// (a stolen credential comes with it) and signs its receipts.
type rogueHost struct {
	t    *testing.T
	nc   *nats.Conn
	host string
	key  nkeys.KeyPair
}

// rogueFrames sends a call's reply frames in order.
type rogueFrames struct {
	r     *rogueHost
	reply string
	id    string
	seq   uint64
}

func (f *rogueFrames) send(kind protocol.FrameKind, data []byte) {
	f.seq++
	h, body := protocol.Frame{Kind: kind, CallID: f.id, Seq: f.seq, Data: data}.Encode()
	if err := f.r.nc.PublishMsg(&nats.Msg{Subject: f.reply, Header: nats.Header(h), Data: body}); err != nil {
		f.r.t.Error(err)
	}
}

func (f *rogueFrames) result(res *protocol.Result) { f.resultSignedBy(res, f.r.key) }

// resultSignedBy sends res with a receipt signed by key.
func (f *rogueFrames) resultSignedBy(res *protocol.Result, key nkeys.KeyPair) {
	res.CallID = f.id
	data, err := protocol.EncodeResult(res)
	if err != nil {
		f.r.t.Error(err)
		return
	}
	parts, err := protocol.Split(data, protocol.ChunkSize)
	if err != nil {
		f.r.t.Error(err)
		return
	}
	rc := protocol.NewReceipt(f.r.host, res, data, time.Now(), time.Now(), nil)
	pub, _ := key.PublicKey()
	if err := rc.Sign(pub, key.Sign); err != nil {
		f.r.t.Error(err)
	}
	for i, p := range parts {
		f.seq++
		fr := protocol.Frame{Kind: protocol.KindResult, CallID: f.id, Seq: f.seq, Part: i + 1, Parts: len(parts), Data: p}
		if i == len(parts)-1 {
			fr.Receipt = rc.Header()
		}
		h, body := fr.Encode()
		if err := f.r.nc.PublishMsg(&nats.Msg{Subject: f.reply, Header: nats.Header(h), Data: body}); err != nil {
			f.r.t.Error(err)
		}
	}
}

// startRogueHost connects a rogue agent for host, serving calls with
// answer, and waits until the gateway lists it online.
func startRogueHost(t *testing.T, env *Env, host string, answer func(call *protocol.Call, f *rogueFrames)) *rogueHost {
	t.Helper()
	r := &rogueHost{t: t, nc: rogueAgent(t, env, host), host: host}
	r.key = env.AgentKey(host)
	calls := map[string]*protocol.Assembly{}
	_, err := r.nc.Subscribe(protocol.CallSubject(host), func(m *nats.Msg) {
		fr, err := protocol.DecodeFrame(protocol.Header(m.Header), m.Data)
		if err != nil {
			return
		}
		asm := calls[fr.CallID]
		if asm == nil {
			asm = protocol.NewAssembly(0)
			calls[fr.CallID] = asm
		}
		if done, err := asm.Add(fr); err != nil || !done {
			return
		}
		delete(calls, fr.CallID)
		var call protocol.Call
		if err := json.Unmarshal(asm.Bytes(), &call); err != nil {
			t.Error(err)
			return
		}
		answer(&call, &rogueFrames{r: r, reply: m.Reply, id: call.ID, seq: fr.Seq})
	})
	if err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(protocol.Announce{Host: host, Instance: "r1", Protocol: protocol.Version, OS: "linux", Arch: "amd64",
		Cwd: "/", Shell: "/bin/sh", Tools: []string{"bash", "read"}, HeartbeatMS: 60000, TrustedKeys: protocol.KeyIDs(env.Gateway.SigningKeys())})
	if err := r.nc.Publish(protocol.PresenceSubject(host), data); err != nil {
		t.Fatal(err)
	}
	env.WaitHost(host, true)
	return r
}

// TestRogueProgressFlood: an agent that floods a call with progress and
// output frames (300 of 100 KB each, then 300 more of output) gets at
// most ten progress notifications a second, of at most 8 KiB each, to
// the client, and the call's final result still arrives intact.
func TestRogueProgressFlood(t *testing.T) {
	env := NewEnv(t)
	chunk := []byte(strings.Repeat("p", 100<<10))
	startRogueHost(t, env, "rogue", func(call *protocol.Call, f *rogueFrames) {
		// Paced, so that the gateway's waiter keeps up and the rate
		// limit, not a full buffer, is what holds the flood back.
		for range 300 {
			f.send(protocol.KindProgress, chunk)
			time.Sleep(2 * time.Millisecond)
		}
		for range 300 {
			f.send(protocol.KindOutput, chunk)
			f.send(protocol.KindKeepalive, nil)
			time.Sleep(2 * time.Millisecond)
		}
		f.result(&protocol.Result{Content: []protocol.Content{protocol.Text("done\n")}})
	})
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			var mu sync.Mutex
			count, largest := 0, 0
			cs := env.Client(era.Version, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
				mu.Lock()
				defer mu.Unlock()
				count++
				largest = max(largest, len(req.Params.Message))
			}})
			params := &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "rogue", "command": "true"}}
			params.SetProgressToken("flood-" + era.Name)
			start := time.Now()
			res, err := cs.CallTool(context.Background(), params)
			elapsed := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if got := mustOK(t, res); got != "done\n" {
				t.Fatalf("final result = %.200q", got)
			}
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%d notifications in %s, the largest %d bytes", count, elapsed.Round(time.Millisecond), largest)
			if largest > protocol.MaxProgressBytes {
				t.Errorf("a progress notification carried %d bytes; at most %d", largest, protocol.MaxProgressBytes)
			}
			if most := int(elapsed/protocol.ProgressInterval) + 1; count > most {
				t.Errorf("%d notifications in %s; at most %d (ten a second)", count, elapsed, most)
			}
		})
	}
}

// TestRogueOversizedResult: results larger than their tool's limits are
// cut (text) or dropped (structured content) with a note, an error
// message is cut, and a read's binary_base64 data, bounded by the result
// limit alone, passes whole.
func TestRogueOversizedResult(t *testing.T) {
	env := NewEnv(t)
	big := strings.Repeat("x", 20<<20)
	startRogueHost(t, env, "rogue", func(call *protocol.Call, f *rogueFrames) {
		var args struct {
			Command      string `json:"command"`
			BinaryBase64 bool   `json:"binary_base64"`
		}
		_ = json.Unmarshal(call.Args, &args)
		switch {
		case call.Tool == "read" && args.BinaryBase64:
			f.result(&protocol.Result{Content: []protocol.Content{protocol.Text(big)}})
		case call.Tool == "read":
			f.result(&protocol.Result{Content: []protocol.Content{protocol.Text(big[:1<<20]), protocol.Text(big[:1<<20])}})
		case args.Command == "structured":
			obj, _ := json.Marshal(map[string]string{"x": big[:1<<20]})
			f.result(&protocol.Result{Content: []protocol.Content{protocol.Text("ok")}, Structured: obj})
		case args.Command == "error":
			f.result(protocol.ErrorResult("", protocol.CodeInternal, big[:1<<20]))
		default:
			f.result(&protocol.Result{Content: []protocol.Content{protocol.Text(big)}, IsError: true})
		}
	})
	cs := env.Client("2025-11-25", nil)
	res := call(t, cs, "bash", map[string]any{"host": "rogue", "command": "anything"})
	if got := text(res); len(got) > protocol.MaxShortResultText+1024 || !strings.Contains(got, "more than the 131072 a bash result may carry") || !res.IsError {
		t.Errorf("bash result of 20 MiB came back as %d bytes (error %v), ending %q", len(got), res.IsError, got[max(0, len(got)-300):])
	}
	res = call(t, cs, "read", map[string]any{"host": "rogue", "path": "/f"})
	if got := text(res); len(got) > protocol.MaxShortResultText+1024 || !strings.Contains(got, "2097152 bytes of text") {
		t.Errorf("read result of 2 MiB came back as %d bytes, ending %q", len(got), got[max(0, len(got)-300):])
	}
	res = call(t, cs, "bash", map[string]any{"host": "rogue", "command": "structured"})
	if res.StructuredContent != nil || !strings.Contains(text(res), "structured content") {
		t.Errorf("1 MiB of structured content for bash: %.300s", text(res))
	}
	res = call(t, cs, "bash", map[string]any{"host": "rogue", "command": "error"})
	if got := text(res); len(got) > protocol.MaxErrorMessage+200 || !res.IsError {
		t.Errorf("an error message of 1 MiB came back as %d bytes", len(got))
	}
	res = call(t, cs, "read", map[string]any{"host": "rogue", "path": "/f", "binary_base64": true})
	if got := text(res); got != big {
		t.Errorf("binary_base64 data of 20 MiB came back as %d bytes", len(got))
	}
}

// TestRogueResultHoldsBudget: an agent that starts a result and then
// holds back its parts, keeping the call alive with keepalives, holds
// only what it sent of the gateway's transfer budget, and only for a few
// silence periods: one 32 KiB part claiming 128 MiB no longer shuts every
// other host's large transfers out for the call's whole timeout, and a
// first part claiming a small result does not let megabytes past the
// budget.
func TestRogueResultHoldsBudget(t *testing.T) {
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) { c.TransferWait = 500 * time.Millisecond }})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(stop); wg.Wait() })
	keepalives := func(f *rogueFrames) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
					f.send(protocol.KindKeepalive, nil)
				}
			}
		}()
	}
	part := func(f *rogueFrames, n, parts int, data []byte) {
		f.seq++
		h, body := protocol.Frame{Kind: protocol.KindResult, CallID: f.id, Seq: f.seq, Part: n, Parts: parts, Data: data}.Encode()
		if err := f.r.nc.PublishMsg(&nats.Msg{Subject: f.reply, Header: nats.Header(h), Data: body}); err != nil {
			t.Error(err)
		}
	}
	startRogueHost(t, env, "rogue", func(call *protocol.Call, f *rogueFrames) {
		var args struct {
			Command string `json:"command"`
		}
		_ = json.Unmarshal(call.Args, &args)
		switch args.Command {
		case "claim":
			// One part, claiming the largest result there is.
			part(f, 1, protocol.MaxResultBytes/protocol.ChunkSize, make([]byte, protocol.ChunkSize))
		case "understate":
			// A first part of one byte, then 6 MiB in the parts after it.
			part(f, 1, 400, []byte{'x'})
			for n := 2; n <= 200; n++ {
				part(f, n, 400, make([]byte, protocol.ChunkSize))
			}
		}
		keepalives(f)
	})
	cs := env.Client("2025-11-25", nil)
	type outcome struct {
		res  *mcp.CallToolResult
		took time.Duration
	}
	rogueCall := func(command string) chan outcome {
		done := make(chan outcome, 1)
		go func() {
			start := time.Now()
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "rogue", "command": command, "timeout": 600}})
			if err != nil {
				t.Error(err)
			}
			done <- outcome{res, time.Since(start)}
		}()
		return done
	}

	claimed := rogueCall("claim")
	waitFor(t, 10*time.Second, "the claimed result to take room", func() bool { return env.Gateway.TransferBytesInUse() > 0 })
	if inUse := env.Gateway.TransferBytesInUse(); inUse > 4*mib {
		t.Errorf("one 32 KiB part claiming 128 MiB holds %.1f MiB of the transfer budget", float64(inUse)/mib)
	}
	res := call(t, cs, "write", map[string]any{"host": "alpha", "path": "big.txt", "content": largeContent(8)})
	if res.IsError {
		t.Errorf("a large write to another host while the rogue holds its result back: %s", text(res))
	}
	o := <-claimed
	t.Logf("the held-back result failed after %s: %.200s", o.took.Round(time.Millisecond), text(o.res))
	if o.res == nil || !o.res.IsError || !strings.Contains(text(o.res), "stopped sending the result") {
		t.Errorf("held-back result: %v", o.res)
	}
	if o.took > 30*time.Second {
		t.Errorf("a result held back kept its call for %s; a few silence periods (2s) at most", o.took)
	}
	waitFor(t, 10*time.Second, "the budget to be free", func() bool { return env.Gateway.TransferBytesInUse() == 0 })

	understated := rogueCall("understate")
	waitFor(t, 10*time.Second, "6 MiB of an understated result to be counted", func() bool { return env.Gateway.TransferBytesInUse() >= 6*mib })
	o = <-understated
	if o.res == nil || !o.res.IsError {
		t.Errorf("understated result held back: %v", o.res)
	}
	waitFor(t, 10*time.Second, "the budget to be free", func() bool { return env.Gateway.TransferBytesInUse() == 0 })
}
