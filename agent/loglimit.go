package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// logLimiter bounds the lines a kind of event may log: at most burst per
// key each interval; the next line logged says how many were left out.
// Its keys are the agent's own (refusal reasons), a bounded set, so a
// flood of forged messages costs a few lines a minute.
type logLimiter struct {
	interval time.Duration
	burst    int

	mu   sync.Mutex
	keys map[string]*logWindow
}

type logWindow struct {
	start         time.Time
	n, suppressed int
}

func newLogLimiter(interval time.Duration, burst int) *logLimiter {
	return &logLimiter{interval: interval, burst: burst, keys: map[string]*logWindow{}}
}

// log writes msg at level unless key has used up its lines.
func (l *logLimiter) log(log *slog.Logger, level slog.Level, key, msg string, args ...any) {
	now := time.Now()
	l.mu.Lock()
	w := l.keys[key]
	if w == nil {
		w = &logWindow{start: now}
		l.keys[key] = w
	}
	if now.Sub(w.start) >= l.interval {
		w.start, w.n = now, 0
	}
	if w.n >= l.burst {
		w.suppressed++
		l.mu.Unlock()
		return
	}
	w.n++
	suppressed := w.suppressed
	w.suppressed = 0
	l.mu.Unlock()
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	log.Log(context.Background(), level, msg, args...)
}
