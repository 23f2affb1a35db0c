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

	"github.com/nats-io/nats.go"

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
	user, pass := env.Gateway.AgentCredentials(host)
	nc, err := nats.Connect(env.NATSURL(), nats.UserInfo(user, pass), nats.CustomInboxPrefix(protocol.AgentInboxPrefix(host)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
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
