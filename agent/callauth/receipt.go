package callauth

import (
	"encoding/base64"
	"fmt"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// ReceiptSigner signs the agent's receipts with its own key, the nkey
// whose public key the gateway enrolled for the host.
type ReceiptSigner struct {
	kp  nkeys.KeyPair
	pub string
}

// NewReceiptSigner returns a signer for the nkey user seed (SU...).
func NewReceiptSigner(seed []byte) (*ReceiptSigner, error) {
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("the agent's key: %w", err)
	}
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return nil, fmt.Errorf("the agent's key is not an nkey user key (SU...)")
	}
	return &ReceiptSigner{kp: kp, pub: pub}, nil
}

// PublicKey returns the signer's public key (U...).
func (s *ReceiptSigner) PublicKey() string { return s.pub }

// Sign returns the HeaderReceipt value of the result res of a call on
// host, encoded as encoded, taken in at start and finished at end, with
// the exit status of the command it ran (nil: none).
func (s *ReceiptSigner) Sign(host string, res *protocol.Result, encoded []byte, start, end time.Time, exit *int) (string, error) {
	r := protocol.NewReceipt(host, res, encoded, start, end, exit)
	if err := r.Sign(s.pub, s.kp.Sign); err != nil {
		return "", err
	}
	return r.Header(), nil
}

// SignReport returns the protocol.HeaderReportSig value of a refusal
// report encoded as data.
func (s *ReceiptSigner) SignReport(data []byte) (string, error) {
	sig, err := s.kp.Sign(protocol.RefusalSigningBytes(data))
	if err != nil {
		return "", fmt.Errorf("sign the refusal report: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(sig), nil
}
