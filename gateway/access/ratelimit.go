package access

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Per-caller rate limits. An access rule or API token may say
//
//	rate_limit: 120/min        # also N/s, N/h, or a bare N (per minute)
//
// A caller's limit is the most generous one among the rules that grant it
// something, a rule without rate_limit counting as the gateway's default
// (Config.RateLimit; none: unlimited). Every tools/call counts once, a
// fan-out across many hosts included. The limit is a token bucket that
// holds one period's worth of calls: a quiet caller may burst up to N calls,
// then gets N per period.

// RateLimit is a number of calls per period. The zero value is no limit.
type RateLimit struct {
	N      int
	Period time.Duration
}

// maxRateCalls bounds N, so a typo does not silently mean "unlimited".
const maxRateCalls = 1_000_000

// ParseRateLimit parses "N/s", "N/min", "N/h" or a bare "N" (per minute).
// "" is no limit.
func ParseRateLimit(s string) (RateLimit, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return RateLimit{}, nil
	}
	num, unit, hasUnit := strings.Cut(s, "/")
	n, err := strconv.Atoi(strings.TrimSpace(num))
	if err != nil || n < 1 || n > maxRateCalls {
		return RateLimit{}, fmt.Errorf("rate limit %q: want a number of calls from 1 to %d, then /s, /min or /h, such as 120/min", s, maxRateCalls)
	}
	period := time.Minute
	if hasUnit {
		switch strings.TrimSpace(unit) {
		case "s", "sec", "second":
			period = time.Second
		case "m", "min", "minute":
			period = time.Minute
		case "h", "hour":
			period = time.Hour
		default:
			return RateLimit{}, fmt.Errorf("rate limit %q: unknown period %q; use /s, /min or /h, such as 120/min", s, unit)
		}
	}
	return RateLimit{N: n, Period: period}, nil
}

// Unlimited reports whether l sets no limit.
func (l RateLimit) Unlimited() bool { return l.N == 0 }

// perSecond is l's sustained rate.
func (l RateLimit) perSecond() float64 {
	if l.Unlimited() {
		return math.Inf(1)
	}
	return float64(l.N) / l.Period.Seconds()
}

// String describes l for people, such as "120 calls per minute".
func (l RateLimit) String() string {
	if l.Unlimited() {
		return "unlimited"
	}
	unit := map[time.Duration]string{time.Second: "second", time.Minute: "minute", time.Hour: "hour"}[l.Period]
	return fmt.Sprintf("%d calls per %s", l.N, unit)
}

// RateDecision is the limit that applies to a caller and the rule it
// comes from.
type RateDecision struct {
	Limit RateLimit
	// Rule is the rule or API token that sets the limit ("" for the
	// gateway's default).
	Rule string
}

// RateLimit returns the caller's rate limit given the gateway default.
func (g *Grants) RateLimit(def RateLimit) RateDecision {
	if len(g.allow) == 0 {
		return RateDecision{Limit: def}
	}
	var best RateDecision
	for i, r := range g.allow {
		cand := RateDecision{Limit: def}
		if !r.rate.Unlimited() {
			cand = RateDecision{Limit: r.rate, Rule: r.name}
		}
		if i == 0 || cand.Limit.perSecond() > best.Limit.perSecond() {
			best = cand
		}
	}
	return best
}

// RateLimiters keeps one token bucket per caller (or other key) and
// limit; the zero value is ready to use. Buckets that
// have refilled carry no state worth keeping and are swept, so the map
// holds only callers active within about one period.
type RateLimiters struct {
	mu        sync.Mutex
	m         map[rateKey]*rate.Limiter
	lastSweep time.Time
}

type rateKey struct {
	caller string
	limit  RateLimit
}

// sweepEvery is how often full buckets are dropped.
const sweepEvery = time.Minute

// Allow takes one call from caller's bucket under limit. When the bucket
// is empty it returns false and how long until a call would be allowed.
func (rl *RateLimiters) Allow(caller string, limit RateLimit, now time.Time) (bool, time.Duration) {
	if limit.Unlimited() {
		return true, 0
	}
	rl.mu.Lock()
	defer rl.mu.Unlock()
	if rl.m == nil {
		rl.m = map[rateKey]*rate.Limiter{}
		rl.lastSweep = now
	}
	if now.Sub(rl.lastSweep) >= sweepEvery {
		for k, l := range rl.m {
			if l.TokensAt(now) >= float64(l.Burst()) {
				delete(rl.m, k)
			}
		}
		rl.lastSweep = now
	}
	key := rateKey{caller, limit}
	l := rl.m[key]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(limit.perSecond()), limit.N)
		rl.m[key] = l
	}
	if l.AllowN(now, 1) {
		return true, 0
	}
	r := l.ReserveN(now, 1)
	wait := r.DelayFrom(now)
	r.CancelAt(now)
	return false, wait
}

// size returns the number of buckets kept.
func (rl *RateLimiters) size() int {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return len(rl.m)
}
