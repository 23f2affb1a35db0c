// Package callauth is the agent's side of signed calls: it checks the
// envelope the gateway signs every message with that makes the agent act
// (protocol/envelope.go) against the gateway keys the agent trusts, its
// own host name, the clock and a replay cache, and it signs the agent's
// receipts (protocol/receipt.go) with the agent's own key. It keeps the
// gateway keys as key sets move them on (protocol/keyset.go).
//
// It exists apart from the agent so that everything that plays an agent
// (simulated fleets, tests) checks messages exactly as the agent does.
// It imports nothing of the module but protocol.
package callauth

import (
	"crypto/ed25519"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// DefaultMaxReplay bounds the replay cache: messages whose envelopes
// have not expired yet (plus the clock skew allowance). At the gateway's
// one-minute envelopes and two minutes of skew that is over 800 messages
// a second, far more than a host takes; beyond it messages are refused
// as busy rather than let through unchecked.
const DefaultMaxReplay = 200_000

// Config configures a Verifier.
type Config struct {
	// Host is the agent's host name: envelopes must name it.
	Host string
	// Instance is this agent process's instance (its announces name
	// it): envelopes must name it, so a message recorded for an earlier
	// process is never run by this one.
	Instance string
	// Keys are the gateway keys trusted at start (the enrolment's, or a
	// later key set's): protocol.FormatSigningKey.
	Keys protocol.KeyState
	// Started is when the agent started: envelopes issued before it
	// (less protocol.CallClockSkew) are refused. Default: now.
	Started time.Time
	// MaxReplay bounds the replay cache (default DefaultMaxReplay).
	MaxReplay int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Verifier checks envelopes. It is safe for concurrent use.
type Verifier struct {
	host     string
	instance string
	started  time.Time
	now      func() time.Time

	mu    sync.RWMutex
	state protocol.KeyState
	byID  map[string]ed25519.PublicKey

	replay replayCache
}

// New returns a Verifier for cfg. A host without keys gets one too: it
// refuses every message (protocol.RefusedNoKeys) until a key set it can
// check arrives, which it never can; it must enrol again.
func New(cfg Config) (*Verifier, error) {
	if err := protocol.ValidateHost(cfg.Host); err != nil {
		return nil, err
	}
	if cfg.Instance == "" {
		return nil, errors.New("callauth: no agent instance: envelopes are checked against the process's instance")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Started.IsZero() {
		cfg.Started = cfg.Now()
	}
	if cfg.MaxReplay <= 0 {
		cfg.MaxReplay = DefaultMaxReplay
	}
	v := &Verifier{host: cfg.Host, instance: cfg.Instance, started: cfg.Started, now: cfg.Now, replay: replayCache{max: cfg.MaxReplay, seen: map[string]int64{}}}
	if err := v.setKeys(cfg.Keys); err != nil {
		return nil, err
	}
	return v, nil
}

func (v *Verifier) setKeys(st protocol.KeyState) error {
	byID := make(map[string]ed25519.PublicKey, len(st.Keys))
	for _, k := range st.Keys {
		pub, err := protocol.ParseSigningKey(k)
		if err != nil {
			return fmt.Errorf("gateway keys: %w", err)
		}
		byID[protocol.KeyID(pub)] = pub
	}
	v.mu.Lock()
	v.state, v.byID = protocol.KeyState{Serial: st.Serial, Keys: slices.Clone(st.Keys)}, byID
	v.mu.Unlock()
	return nil
}

// Keys returns the key state in force.
func (v *Verifier) Keys() protocol.KeyState {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return protocol.KeyState{Serial: v.state.Serial, Keys: slices.Clone(v.state.Keys)}
}

// KeyIDs returns the ids of the trusted keys, as announces carry them.
func (v *Verifier) KeyIDs() []string { return protocol.KeyIDs(v.Keys().Keys) }

// Apply takes in the newer key sets of chain it can check
// (protocol.KeyState.Apply) and reports whether the keys changed. On an
// error the sets before it are taken in all the same.
func (v *Verifier) Apply(chain *protocol.KeySetChain) (changed bool, err error) {
	cur := v.Keys()
	next, err := cur.Apply(chain)
	if next.Serial == cur.Serial {
		return false, err
	}
	if serr := v.setKeys(next); serr != nil {
		return false, serr
	}
	return true, err
}

func (v *Verifier) lookup(id string) (ed25519.PublicKey, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	pub, ok := v.byID[id]
	return pub, ok
}

// Expect is what the receiver knows of a message before it reads its
// envelope: what kind it is (by the subject it came on), the reply
// subject it came with, and the call it is about when the message says
// so outside the envelope (a frame's call id; empty: any).
type Expect struct {
	Kind, Reply, CallID string
}

// Open checks the envelope of a message: the signature, then that it is
// for this host, of the expected kind, call and reply subject, and in
// time. Whether it was seen before is Commit's to say, once the body
// checked out (CheckBody), so that a tampered copy cannot make the
// genuine message be refused; Seen tells early. Errors are
// *protocol.EnvelopeError.
func (v *Verifier) Open(auth string, want Expect) (*protocol.Claims, error) {
	v.mu.RLock()
	none := len(v.byID) == 0
	v.mu.RUnlock()
	if none {
		return nil, &protocol.EnvelopeError{Reason: protocol.RefusedNoKeys, Msg: fmt.Sprintf(
			"host %s knows no gateway signing key (it was enrolled before calls were signed), so it runs nothing: enrol it again with fleet-agent join", v.host)}
	}
	c, err := protocol.OpenEnvelope(auth, v.lookup)
	if err != nil {
		return nil, err
	}
	refuse := func(reason protocol.RefusalReason, format string, args ...any) (*protocol.Claims, error) {
		return c, &protocol.EnvelopeError{Reason: reason, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Host != v.host:
		return refuse(protocol.RefusedWrongHost, "the envelope is for host %s, and this is host %s: a message re-targeted at another host is never run", c.Host, v.host)
	case c.Instance != v.instance:
		return refuse(protocol.RefusedOtherInstance, "the envelope is for agent process %s of host %s, and this is process %s: a message for the process before a restart is never run by the next (the gateway signs for the process it heard announce)",
			protocol.Excerpt(c.Instance), v.host, v.instance)
	case c.Kind != want.Kind:
		return refuse(protocol.RefusedMismatch, "the envelope is for a %s and came as a %s", c.Kind, want.Kind)
	case want.CallID != "" && c.CallID != want.CallID:
		return refuse(protocol.RefusedMismatch, "the envelope is for call %s and came with call %s", c.CallID, protocol.Excerpt(want.CallID))
	case c.Reply != want.Reply:
		return refuse(protocol.RefusedMismatch, "the envelope names the reply subject %s and came with %s", protocol.Excerpt(c.Reply), protocol.Excerpt(want.Reply))
	}
	if err := c.CheckTime(v.now(), v.started); err != nil {
		return c, err
	}
	return c, nil
}

// Seen refuses a message taken in already, before its body is at hand
// (the first part of a call in parts).
func (v *Verifier) Seen(c *protocol.Claims) error {
	if v.replay.has(c.MsgID) {
		return &protocol.EnvelopeError{Reason: protocol.RefusedReplayed, Msg: fmt.Sprintf(
			"message %s (%s %s) was taken in already: a replayed message is never run again", c.MsgID, c.Kind, c.CallID)}
	}
	return nil
}

// CheckBody checks that body is exactly what the envelope signed.
func CheckBody(c *protocol.Claims, body []byte) error {
	if int64(len(body)) != c.BodySize || sha256.Sum256(body) != c.BodySHA256 {
		return &protocol.EnvelopeError{Reason: protocol.RefusedTampered, Msg: fmt.Sprintf(
			"the %s's body (%d bytes) is not the %d bytes the gateway signed: it was changed on the way", c.Kind, len(body), c.BodySize)}
	}
	return nil
}

// Commit records the message of c as seen; it fails when it was seen
// already, or when the replay cache is full.
func (v *Verifier) Commit(c *protocol.Claims) error {
	return v.replay.add(c.MsgID, c.Expires.Add(protocol.CallClockSkew), v.now())
}

// OpenBody is Open, CheckBody and Commit for a message whose body is at
// hand.
func (v *Verifier) OpenBody(auth string, want Expect, body []byte) (*protocol.Claims, error) {
	c, err := v.Open(auth, want)
	if err == nil {
		err = CheckBody(c, body)
	}
	if err == nil {
		err = v.Commit(c)
	}
	return c, err
}

// replayCache holds the ids of messages seen, until their envelopes
// expire (plus the skew allowance): an expired envelope is refused
// anyway.
type replayCache struct {
	mu   sync.Mutex
	max  int
	seen map[string]int64 // message id -> when it may be forgotten (Unix ms)
	// order is the ids in the order they came, to forget the oldest
	// first; head is the first not forgotten.
	order []replayEntry
	head  int
}

type replayEntry struct {
	id    string
	until int64
}

func (r *replayCache) has(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.seen[id]
	return ok
}

// errFull says why add refused a message when the cache is full.
var errFull = errors.New("full")

func (r *replayCache) add(id string, until, now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(now.UnixMilli())
	if _, ok := r.seen[id]; ok {
		return &protocol.EnvelopeError{Reason: protocol.RefusedReplayed, Msg: fmt.Sprintf("message %s was taken in already: a replayed message is never run again", id)}
	}
	if len(r.seen) >= r.max {
		return &protocol.EnvelopeError{Reason: protocol.RefusedBusy, Msg: fmt.Sprintf(
			"the host has %d messages in its replay cache (%v), its limit; retry shortly", len(r.seen), errFull)}
	}
	r.seen[id] = until.UnixMilli()
	r.order = append(r.order, replayEntry{id: id, until: until.UnixMilli()})
	return nil
}

// pruneLocked forgets, oldest first, the messages that may be
// forgotten by now; it stops at the first that may not (envelopes of one
// gateway expire in the order they were issued, so few wait longer than
// they must).
func (r *replayCache) pruneLocked(now int64) {
	for r.head < len(r.order) && r.order[r.head].until < now {
		delete(r.seen, r.order[r.head].id)
		r.order[r.head] = replayEntry{}
		r.head++
	}
	if r.head > 1024 && r.head > len(r.order)/2 {
		r.order = append(r.order[:0:0], r.order[r.head:]...)
		r.head = 0
	}
}

// Len returns how many messages the replay cache holds.
func (v *Verifier) Len() int {
	v.replay.mu.Lock()
	defer v.replay.mu.Unlock()
	return len(v.replay.seen)
}
