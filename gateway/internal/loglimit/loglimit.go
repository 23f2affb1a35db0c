// Package loglimit bounds the log lines one source can cause (a flood of
// bad messages from one agent costs a few lines a minute). It knows no
// gateway concern and imports nothing from the module.
package loglimit

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Limiter bounds the log lines one source can cause: at most burst
// lines per key in each interval; the rest are counted, and the next line
// logged for the key says how many were suppressed. A flood of bad
// messages from one agent thus costs a few lines a minute, not one per
// message. It tracks at most maxKeys keys: beyond that, keys share one
// overflow key, so its memory is bounded too.
type Limiter struct {
	interval time.Duration
	burst    int
	maxKeys  int
	now      func() time.Time

	mu   sync.Mutex
	keys map[string]*logWindow
	// pruned is when keys were last pruned: a full table of keys still
	// in their window (10,000 hosts coming online at once) is looked
	// through once every interval/8, not once per new key.
	pruned time.Time
}

type logWindow struct {
	start      time.Time
	n          int // lines logged in the window
	suppressed int // lines suppressed since the last one logged
}

// overflowKey is the key of sources beyond maxKeys.
const overflowKey = "\x00overflow"

// New returns a limiter of burst lines per key in each interval.
func New(interval time.Duration, burst int) *Limiter {
	return &Limiter{interval: interval, burst: burst, maxKeys: 4096, now: time.Now, keys: make(map[string]*logWindow)}
}

// allow reports whether a line for key may be logged now and, when it
// may, how many lines for key were suppressed since the last one.
func (l *Limiter) allow(key string) (ok bool, suppressed int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.keys[key]
	if w == nil {
		if len(l.keys) >= l.maxKeys && now.Sub(l.pruned) >= l.interval/8 {
			l.prune(now)
			l.pruned = now
		}
		if len(l.keys) >= l.maxKeys {
			key = overflowKey
			w = l.keys[key]
		}
		if w == nil {
			w = &logWindow{start: now}
			l.keys[key] = w
		}
	}
	if now.Sub(w.start) >= l.interval {
		w.start, w.n = now, 0
	}
	if w.n >= l.burst {
		w.suppressed++
		return false, 0
	}
	w.n++
	suppressed, w.suppressed = w.suppressed, 0
	return true, suppressed
}

// prune drops the keys whose window ended with nothing suppressed. The
// caller holds l.mu.
func (l *Limiter) prune(now time.Time) {
	for k, w := range l.keys {
		if now.Sub(w.start) >= l.interval && w.suppressed == 0 {
			delete(l.keys, k)
		}
	}
}

// Log writes msg at level unless key has used up its lines; a line that
// follows suppressed ones says how many. A nil limiter limits nothing.
func (l *Limiter) Log(log *slog.Logger, level slog.Level, key, msg string, args ...any) {
	if l == nil {
		log.Log(context.Background(), level, msg, args...)
		return
	}
	if !log.Enabled(context.Background(), level) {
		return
	}
	ok, suppressed := l.allow(key)
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed, "per", l.interval)
	}
	log.Log(context.Background(), level, msg, args...)
}
