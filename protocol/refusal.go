package protocol

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"time"
)

// An agent refuses a message whose envelope does not hold (envelope.go)
// without running it, and without answering it when the refusal may be
// a forgery's (a reply subject it cannot trust). It tells the gateways
// instead, on RefusedSubject: the gateway whose call it was fails the
// call at once with the agent's reason and records the refusal with its
// own record of the call (a report is the host's word: it never names
// the caller in the trail). An agent reports a bounded number of
// refusals per second (the gateways take no more from a host) and counts
// those it left out, so a flood of forgeries costs the trail little. Each report is signed with the agent's own key (the one
// its receipts are signed with, HeaderReportSig): a report that key did
// not sign ends no call and is not recorded, as anyone on the account may
// publish on the subject.

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

// HeaderReportSig carries the signature of a refusal report: base64url
// (no padding) of the ed25519 signature, by the key the gateway enrolled
// for the host, of refusalMagic followed by the report's exact bytes.
const HeaderReportSig = "Fleet-Report-Sig"

const refusalMagic = "fleetmcp-refusal-v1\n"

// RefusalSigningBytes is what an agent signs of a report encoded as data.
func RefusalSigningBytes(data []byte) []byte {
	return append([]byte(refusalMagic), data...)
}

// VerifyRefusal checks that sig (a HeaderReportSig value) signs the
// report data with key (an nkey user public key, U...).
func VerifyRefusal(key string, data []byte, sig string) error {
	if sig == "" {
		return errors.New("the refusal report is not signed")
	}
	pub, err := ParseUserKey(key)
	if err != nil {
		return err
	}
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(raw) != ed25519.SignatureSize || !ed25519.Verify(pub, RefusalSigningBytes(data), raw) {
		return errors.New("the refusal report's signature does not verify with the host's enrolled key")
	}
	return nil
}
