// Package signing holds the gateway's ed25519 signing keys: loading the
// signing directory, the chain of key sets agents move on with, and
// rotation and retirement (keys.go); serving that chain to agents and
// pushing it to them (serve.go); and the envelopes that sign every
// message that makes an agent act, and the check of the receipts agents
// sign their results with (envelope.go).
//
// It must not import gateway or any other package of it but
// gateway/internal/...: the gateway hands it a NATS connection and plain
// function values (the hosts online, the clock, a host's enrolled key).
package signing
