// Package seal seals the records the gateways store where any user of
// the fleet's NATS account could write (agent records, join tokens, audit
// records, revoked keys): each is stored as its JSON and an HMAC-SHA256
// of it under a key derived from the agent signing key, which every
// gateway of the fleet holds and no NATS credential carries. It knows no
// gateway concern and imports nothing from the module.
package seal

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nkeys"
)

// Kind names what a record is, so that a sealed record of one kind is
// never taken for another.
type Kind string

// Seal seals and opens records, each under a Kind of its own.
type Seal struct{ key []byte }

// New derives the sealing key from the agent signing key.
func New(agentSigner nkeys.KeyPair) (*Seal, error) {
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

func (s *Seal) sum(kind Kind, key string, record []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(kind))
	m.Write([]byte{0})
	m.Write([]byte(key))
	m.Write([]byte{0})
	m.Write(record)
	return m.Sum(nil)
}

// Seal encodes v, the record of kind stored under key.
func (s *Seal) Seal(kind Kind, key string, v any) ([]byte, error) {
	record, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(sealed{Record: record, Seal: base64.RawURLEncoding.EncodeToString(s.sum(kind, key, record))})
}

// Mark returns the seal of data, the record of kind stored under key, as
// text (for a message header).
func (s *Seal) Mark(kind Kind, key string, data []byte) string {
	return base64.RawURLEncoding.EncodeToString(s.sum(kind, key, data))
}

// Holds reports whether mark is the seal of data, the record of kind
// stored under key.
func (s *Seal) Holds(kind Kind, key string, data []byte, mark string) bool {
	sum, err := base64.RawURLEncoding.DecodeString(mark)
	return err == nil && hmac.Equal(sum, s.sum(kind, key, data))
}

// errBadSeal is a record the gateways did not write.
var errBadSeal = errors.New("its seal does not hold: no gateway of this fleet wrote it (a NATS user of the fleet's account may have)")

// Open checks data, the record of kind stored under key, and decodes it
// into v.
func (s *Seal) Open(kind Kind, key string, data []byte, v any) error {
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
