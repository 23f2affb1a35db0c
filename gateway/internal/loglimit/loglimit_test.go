package loglimit

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"
)

func TestLogLimiter(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	l := New(time.Minute, 2)
	l.now = func() time.Time { return now }
	l.maxKeys = 3
	for i, want := range []bool{true, true, false, false} {
		if ok, _ := l.allow("a"); ok != want {
			t.Fatalf("line %d allowed=%v, want %v", i, ok, want)
		}
	}
	now = now.Add(time.Minute)
	if ok, n := l.allow("a"); !ok || n != 2 {
		t.Errorf("after the interval: allowed=%v, suppressed=%d; want true, 2", ok, n)
	}
	// Beyond maxKeys, new keys share one.
	for _, k := range []string{"b", "c", "d", "e", "f"} {
		l.allow(k)
	}
	if len(l.keys) > 4 {
		t.Errorf("%d keys tracked, want at most 3 and the overflow key", len(l.keys))
	}
}

// A full table of keys still in their window is looked through at most
// once an eighth of the interval, not at every new key (a fleet coming
// online at once logs a line per host); keys whose window ended are
// pruned then. Lines at a level the logger drops cost no key.
func TestLogLimiterPrunesSeldom(t *testing.T) {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	l := New(time.Minute, 1)
	l.now = func() time.Time { return now }
	l.maxKeys = 3
	for _, k := range []string{"a", "b", "c"} {
		l.allow(k)
	}
	now = now.Add(time.Second)
	l.allow("d") // full: pruned (nothing ends), d shares the overflow key
	first := l.pruned
	if !first.Equal(now) || l.keys["d"] != nil || l.keys[overflowKey] == nil {
		t.Fatalf("after the first new key beyond the table: pruned %v, keys %v", l.pruned, l.keys)
	}
	now = now.Add(time.Second)
	l.allow("e")
	if !l.pruned.Equal(first) {
		t.Error("the full table was looked through again a second later")
	}
	now = now.Add(time.Minute)
	l.allow("f") // a, b and c have ended: pruned, and f gets its own key
	if l.pruned.Equal(first) || l.keys["f"] == nil || l.keys["a"] != nil {
		t.Errorf("a minute later: pruned %v, keys %v", l.pruned, l.keys)
	}

	quiet := New(time.Minute, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i := range 100 {
		quiet.Log(log, slog.LevelInfo, fmt.Sprint("host-", i), "host online")
	}
	if len(quiet.keys) != 0 {
		t.Errorf("lines the logger drops took %d keys", len(quiet.keys))
	}
}
