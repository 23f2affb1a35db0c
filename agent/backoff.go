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

// HandshakeTimeout bounds an agent's NATS handshake (the server's INFO,
// the agent's CONNECT with its signed nonce, the server's answer), and
// DialTimeout the TCP connection before it. A server that a whole fleet
// reconnects to at once checks thousands of credentials (two signatures
// each in operator mode) and answers late: a client that gave up after
// the NATS client's default 2 s would have that work done for nothing and
// queue again, so that part of the fleet might never get through. With
// this bound, one that waits its turn is let in.
const (
	HandshakeTimeout = 20 * time.Second
	DialTimeout      = 5 * time.Second
)

// ReconnectDelay returns how long an agent waits before attempt (from 1)
// to reach NATS again: a random duration up to a ceiling that starts at
// lo and doubles with every attempt up to hi ("full jitter"). It is
// exported so that simulated fleets reconnect exactly as agents do.
func ReconnectDelay(attempt int, lo, hi time.Duration) time.Duration {
	return reconnectDelay(attempt, lo, hi)
}
