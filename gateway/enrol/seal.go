package enrol

import (
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/internal/seal"
)

// The agent records and the join tokens decide who a host is: its key
// (which receipts are checked against), its labels (which access rules
// and selectors act on), whether it is revoked, and who may enrol. They
// live in JetStream buckets, which any user of the fleet's NATS account
// can write, not only the gateways: a leaked gateway credential could
// otherwise give a host another key (and forge its results) or mint a
// join token of its own. So every record is stored sealed: its JSON, and
// an HMAC-SHA256 of it under a key derived from the agent signing key,
// which every gateway of the fleet holds and no NATS credential carries
// (whoever holds it can mint any host's credential anyway). A record
// whose seal does not hold is ignored: the gateways keep the last good
// one they read (agents.go), and an enrolment with a forged token fails.

// SealKind names what a record is, so that a sealed record of one kind
// is never taken for another.
type SealKind = seal.Kind

const (
	sealAgent SealKind = "agent"
	sealToken SealKind = "token"
)

// Seal seals and opens records: the agent records and join tokens here,
// and whatever else the gateway stores sealed (audit records, revoked
// keys), each under a SealKind of its own (gateway/internal/seal).
type Seal = seal.Seal

// NewSeal derives the sealing key from the agent signing key.
func NewSeal(agentSigner nkeys.KeyPair) (*Seal, error) { return seal.New(agentSigner) }
