package protocol

import (
	"fmt"
	"time"
)

// An agent refuses a message whose envelope does not hold (envelope.go)
// without running it, and without answering it when the refusal may be
// a forgery's (a reply subject it cannot trust). It tells the gateways
// instead, on RefusedSubject: they record every refusal in the audit
// trail, and the gateway whose call it was fails the call at once with
// the agent's reason. An agent reports a bounded number of refusals per
// second and counts those it left out, so a flood of forgeries costs the
// trail little.

// RefusedSubjectAll is what the gateways subscribe to.
var RefusedSubjectAll = RefusedSubject("*")

// Refusal is an agent's report of a message it refused.
type Refusal struct {
	Host string `json:"host"`
	// Kind is the message's kind (MsgCall...), by the subject it came
	// on.
	Kind   string        `json:"kind"`
	Reason RefusalReason `json:"reason"`
	// Message says why, for people.
	Message string `json:"message"`
	// CallID, Tool, Caller and KeyID are what the message claimed, when
	// it could be read: unverified unless Reason says the signature
	// held (wrong_host, mismatch, expired, future, before_start,
	// replayed, tampered, busy).
	CallID string    `json:"call_id,omitempty"`
	Tool   string    `json:"tool,omitempty"`
	Caller string    `json:"caller,omitempty"`
	KeyID  string    `json:"key_id,omitempty"`
	At     time.Time `json:"at"`
	// Suppressed counts refusals the agent did not report since its last
	// report (its rate limit).
	Suppressed int64 `json:"suppressed,omitempty"`
}

// MaxRefusalBytes bounds an encoded Refusal.
const MaxRefusalBytes = 8 << 10

// Validate checks a received report's form.
func (r *Refusal) Validate() error {
	if err := ValidateHost(r.Host); err != nil {
		return fmt.Errorf("refusal: %w", err)
	}
	if r.CallID != "" {
		if err := ValidateCallID(r.CallID); err != nil {
			return fmt.Errorf("refusal: %w", err)
		}
	}
	for _, f := range [...]struct{ name, v string }{{"kind", r.Kind}, {"reason", string(r.Reason)}, {"tool", r.Tool}, {"caller", r.Caller}, {"key_id", r.KeyID}} {
		if err := checkLen("refusal "+f.name, f.v, 256); err != nil {
			return err
		}
	}
	if r.Suppressed < 0 {
		return fmt.Errorf("refusal: negative suppressed count %d", r.Suppressed)
	}
	return checkLen("refusal message", r.Message, 2048)
}
