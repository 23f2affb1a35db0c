package callauth

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// ReceiptSigner signs the agent's receipts with its own key, the nkey
// whose public key the gateway enrolled for the host. It holds the
// ed25519 key the nkey seed stands for, derived once: nkeys derives it
// again from the seed on every signature, which doubles a receipt's
// cost. The signatures are the same (ed25519 is deterministic).
type ReceiptSigner struct {
	priv ed25519.PrivateKey
	pub  string
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
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil || len(raw) != ed25519.SeedSize {
		return nil, fmt.Errorf("the agent's key: its seed does not decode")
	}
	priv := ed25519.NewKeyFromSeed(raw)
	want, err := protocol.ParseUserKey(pub)
	if err != nil || !bytes.Equal(priv.Public().(ed25519.PublicKey), want) {
		return nil, fmt.Errorf("the agent's key: its seed does not give its public key")
	}
	return &ReceiptSigner{priv: priv, pub: pub}, nil
}

// PublicKey returns the signer's public key (U...).
func (s *ReceiptSigner) PublicKey() string { return s.pub }

// Sign returns the HeaderReceipt value of the result res of a call on
// host, encoded as encoded, taken in at start and finished at end, with
// the exit status of the command it ran (nil: none).
func (s *ReceiptSigner) Sign(host string, res *protocol.Result, encoded []byte, start, end time.Time, exit *int) (string, error) {
	r := protocol.NewReceipt(host, res, encoded, start, end, exit)
	if err := r.Sign(s.pub, s.sign); err != nil {
		return "", err
	}
	return r.Header(), nil
}

func (s *ReceiptSigner) sign(msg []byte) ([]byte, error) { return ed25519.Sign(s.priv, msg), nil }

// SignReport returns the protocol.HeaderReportSig value of a refusal
// report encoded as data.
func (s *ReceiptSigner) SignReport(data []byte) (string, error) {
	sig, _ := s.sign(protocol.RefusalSigningBytes(data))
	return base64.RawURLEncoding.EncodeToString(sig), nil
}
