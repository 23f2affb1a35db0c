package enrol

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"
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
type SealKind string

const (
	sealAgent SealKind = "agent"
	sealToken SealKind = "token"
)

// Seal seals and opens records: the agent records and join tokens here,
// and whatever else the gateway stores sealed (audit records, revoked
// keys), each under a SealKind of its own.
type Seal struct{ key []byte }

// NewSeal derives the sealing key from the agent signing key.
func NewSeal(agentSigner nkeys.KeyPair) (*Seal, error) {
	seed, err := agentSigner.Seed()
	if err != nil {
		return nil, fmt.Errorf("record seal: %w", err)
	}
	m := hmac.New(sha256.New, seed)
	m.Write([]byte("fleetmcp record seal v1"))
	return &Seal{key: m.Sum(nil)}, nil
}

// sealed is a record as stored.
type sealed struct {
	Record json.RawMessage `json:"record"`
	Seal   string          `json:"seal"`
}

func (s *Seal) sum(kind SealKind, key string, record []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(kind))
	m.Write([]byte{0})
	m.Write([]byte(key))
	m.Write([]byte{0})
	m.Write(record)
	return m.Sum(nil)
}

// Seal encodes v, the record of kind stored under key.
func (s *Seal) Seal(kind SealKind, key string, v any) ([]byte, error) {
	record, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(sealed{Record: record, Seal: base64.RawURLEncoding.EncodeToString(s.sum(kind, key, record))})
}

// Mark returns the seal of data, the record of kind stored under key, as
// text (for a message header).
func (s *Seal) Mark(kind SealKind, key string, data []byte) string {
	return base64.RawURLEncoding.EncodeToString(s.sum(kind, key, data))
}

// Holds reports whether mark is the seal of data, the record of kind
// stored under key.
func (s *Seal) Holds(kind SealKind, key string, data []byte, mark string) bool {
	sum, err := base64.RawURLEncoding.DecodeString(mark)
	return err == nil && hmac.Equal(sum, s.sum(kind, key, data))
}

// errBadSeal is a record the gateways did not write.
var errBadSeal = errors.New("its seal does not hold: no gateway of this fleet wrote it (a NATS user of the fleet's account may have)")

// Open checks data, the record of kind stored under key, and decodes it
// into v.
func (s *Seal) Open(kind SealKind, key string, data []byte, v any) error {
	var in sealed
	if err := json.Unmarshal(data, &in); err != nil {
		return fmt.Errorf("not a sealed record: %w", err)
	}
	sum, err := base64.RawURLEncoding.DecodeString(in.Seal)
	if err != nil || !hmac.Equal(sum, s.sum(kind, key, in.Record)) {
		return errBadSeal
	}
	return json.Unmarshal(in.Record, v)
}
