package agent

import "time"

// Default bounds of the reconnect backoff. The ceiling is what a fleet's
// return after a NATS outage takes at most once NATS is back: every agent
// retries at a uniformly random moment below the current ceiling, so
// 10,000 agents return spread over up to DefaultReconnectMax rather than
// at once, and none waits longer than that.
const (
	DefaultReconnectMin = 500 * time.Millisecond
	DefaultReconnectMax = 10 * time.Second
)

// ReconnectDelay returns how long an agent waits before attempt (from 1)
// to reach NATS again: a random duration up to a ceiling that starts at
// lo and doubles with every attempt up to hi ("full jitter"). It is
// exported so that simulated fleets reconnect exactly as agents do.
func ReconnectDelay(attempt int, lo, hi time.Duration) time.Duration {
	return reconnectDelay(attempt, lo, hi)
}
