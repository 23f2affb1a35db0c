package protocol

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// This file is how agents learn the gateway's signing keys after
// enrolment. The gateway keeps a chain of key sets: each names the keys
// valid from then on (the one that signs first) and is signed by a key
// of the set before it, so an agent that trusts one set can check the
// next. A rotation adds a set with the new key and the old one (both
// valid: calls signed by either run), and retiring the old key adds a
// set without it. Agents ask for the chain when they connect
// (KeysSubject) and the gateways push it to them (KeysPushSubject) when
// it changes; an agent applies, in order, every set newer than the one
// it holds whose signature it can check, and stops at the first it
// cannot. An agent that missed sets catches up through the chain as long
// as the gateway keeps them (MaxKeySets).

// KeysSubjectAll is what the gateways serve (in a queue group).
var KeysSubjectAll = KeysSubject("*")

// PurposeKeySet is the signing purpose of key sets.
const PurposeKeySet = "signing-keys"

// Bounds of key sets.
const (
	// MaxKeySetKeys bounds the keys of one set.
	MaxKeySetKeys = 4
	// MaxKeySets bounds the sets of a chain the gateway keeps and
	// sends.
	MaxKeySets = 32
	// MaxKeySetChainBytes bounds an encoded chain.
	MaxKeySetChainBytes = 64 << 10
)

// KeySet is the gateway keys valid from its Serial on.
type KeySet struct {
	// Serial grows by one with every set.
	Serial uint64 `json:"serial"`
	// Keys are the valid keys (FormatSigningKey), the one the gateway
	// signs with first.
	Keys []string  `json:"keys"`
	At   time.Time `json:"at"`
}

// CanonicalBytes is what the keys that sign a set sign.
func (s *KeySet) CanonicalBytes() []byte {
	var b []byte
	b = putField(b, "serial", strconv.FormatUint(s.Serial, 10))
	b = putField(b, "at", s.At.UTC().Format(time.RFC3339Nano))
	b = putField(b, "keys", strconv.Itoa(len(s.Keys)))
	for _, k := range s.Keys {
		b = putField(b, "key", k)
	}
	return b
}

// Validate checks a set's form: 1 to MaxKeySetKeys distinct keys that
// parse.
func (s *KeySet) Validate() error {
	if len(s.Keys) == 0 || len(s.Keys) > MaxKeySetKeys {
		return fmt.Errorf("key set %d has %d keys; 1 to %d are allowed", s.Serial, len(s.Keys), MaxKeySetKeys)
	}
	for i, k := range s.Keys {
		if _, err := ParseSigningKey(k); err != nil {
			return fmt.Errorf("key set %d: %w", s.Serial, err)
		}
		if slices.Contains(s.Keys[:i], k) {
			return fmt.Errorf("key set %d lists %s twice", s.Serial, Ellipsis(k, 40))
		}
	}
	return nil
}

// SignedKeySet is a key set with the signatures of keys of the set
// before it (and of its own new keys, which proves the gateway holds
// them).
type SignedKeySet struct {
	Set        KeySet      `json:"set"`
	Signatures []Signature `json:"signatures"`
}

// KeySetChain is the gateway's chain of key sets, oldest first.
type KeySetChain struct {
	Sets []SignedKeySet `json:"sets"`
}

// KeyState is the gateway keys an agent trusts: the serial of the set
// they come from (0: the keys it got at enrolment, before any set) and
// the keys.
type KeyState struct {
	Serial uint64
	Keys   []string
}

// Apply takes in the sets of chain newer than st, in order, each only if
// a key st trusts at that point signs it, and returns the state it ends
// in. It stops at the first newer set it cannot take, and returns the
// state so far with an error saying why.
func (st KeyState) Apply(chain *KeySetChain) (KeyState, error) {
	if chain == nil {
		return st, nil
	}
	if len(chain.Sets) > MaxKeySets {
		return st, fmt.Errorf("the key set chain has %d sets; at most %d are allowed", len(chain.Sets), MaxKeySets)
	}
	for i := range chain.Sets {
		s := &chain.Sets[i]
		if s.Set.Serial <= st.Serial {
			continue
		}
		if err := s.Set.Validate(); err != nil {
			return st, err
		}
		if s.Set.Serial != st.Serial+1 {
			// Serials grow by one: a set that skips some is not from this
			// gateway's chain (or the host missed sets the chain no longer
			// holds), and a jump to a far serial would lock the host out
			// of every later set.
			return st, fmt.Errorf("key set %d follows set %d, which this host holds: serials grow by one; enrol the host again if it missed a rotation the gateway no longer keeps",
				s.Set.Serial, st.Serial)
		}
		if err := s.verify(st.Keys); err != nil {
			return st, err
		}
		st = KeyState{Serial: s.Set.Serial, Keys: slices.Clone(s.Set.Keys)}
	}
	return st, nil
}

// verify checks that a key of trusted signs s. A set carries at most
// MaxKeySetKeys signatures, and each trusted key's is checked once: an
// unchecked message (key sets are not in envelopes) costs the host a few
// signature checks at most.
func (s *SignedKeySet) verify(trusted []string) error {
	if len(s.Signatures) > MaxKeySetKeys {
		return fmt.Errorf("key set %d has %d signatures; at most %d are allowed", s.Set.Serial, len(s.Signatures), MaxKeySetKeys)
	}
	msg := s.Set.CanonicalBytes()
	tried := make([]string, 0, len(s.Signatures))
	for _, sig := range s.Signatures {
		if !slices.Contains(trusted, sig.Key) || slices.Contains(tried, sig.Key) {
			continue
		}
		tried = append(tried, sig.Key)
		if VerifyBytes(trusted, PurposeKeySet, msg, sig) == nil {
			return nil
		}
	}
	return fmt.Errorf("key set %d is signed by none of the keys this host trusts (%s): it missed a rotation the gateway no longer keeps; enrol the host again",
		s.Set.Serial, strings.Join(KeyIDs(trusted), ", "))
}

// SignKeySet signs set with every key of signers.
func SignKeySet(set KeySet, signers ...ed25519.PrivateKey) (SignedKeySet, error) {
	if err := set.Validate(); err != nil {
		return SignedKeySet{}, err
	}
	if len(signers) == 0 {
		return SignedKeySet{}, errors.New("a key set needs a signature")
	}
	out := SignedKeySet{Set: set}
	for _, priv := range signers {
		out.Signatures = append(out.Signatures, SignBytes(priv, PurposeKeySet, set.CanonicalBytes()))
	}
	return out, nil
}

// KeyIDs returns the KeyID of each signing key (FormatSigningKey) that
// parses.
func KeyIDs(keys []string) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		if pub, err := ParseSigningKey(k); err == nil {
			out = append(out, KeyID(pub))
		}
	}
	return out
}
