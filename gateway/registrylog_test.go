package gateway

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// Each change of a host's state is logged once, at info or above: online,
// offline (heartbeats stopped), back online, left. Heartbeats and repeated
// sweeps log nothing.
func TestRegistryLogsStateChangesOnce(t *testing.T) {
	r, clock := newTestRegistry()
	var buf bytes.Buffer
	r.log = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	take := func() []string {
		t.Helper()
		out := strings.Split(strings.TrimSpace(buf.String()), "\n")
		buf.Reset()
		if len(out) == 1 && out[0] == "" {
			return nil
		}
		return out
	}
	want := func(step string, msgs ...string) {
		t.Helper()
		got := take()
		if len(got) != len(msgs) {
			t.Fatalf("%s: logged %q, want %d lines %q", step, got, len(msgs), msgs)
		}
		for i, m := range msgs {
			if !strings.Contains(got[i], "msg=\""+m) || !strings.Contains(got[i], "host=web-1") {
				t.Fatalf("%s: line %q, want %q about web-1", step, got[i], m)
			}
		}
	}
	a := announceOf("web-1")
	a.Instance = "i1"
	announce(t, r, a)
	want("first announce", "host online")
	for range 3 {
		clock.advance(5 * time.Second)
		announce(t, r, a)
		r.logOffline(clock.now())
	}
	want("heartbeats")
	clock.advance(20 * time.Second)
	r.logOffline(clock.now())
	want("silence", "host offline")
	clock.advance(5 * time.Second)
	r.logOffline(clock.now())
	want("second sweep")
	announce(t, r, a)
	got := take()
	if len(got) != 1 || !strings.Contains(got[0], `msg="host back online"`) || !strings.Contains(got[0], "away=25s") {
		t.Fatalf("return: logged %q, want one back-online line with away=25s", got)
	}
	a.Leaving = true
	announce(t, r, a)
	want("goodbye", "host left")
	// The goodbye repeated (the agent says it as it drains and as it
	// closes) is logged once.
	announce(t, r, a)
	want("second goodbye")
	clock.advance(time.Minute)
	r.logOffline(clock.now())
	want("sweep after goodbye")
}
