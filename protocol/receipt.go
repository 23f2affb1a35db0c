package protocol

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base32"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// This file is the receipt every final result carries: what the machine
// itself says it did, signed with the agent's own key (the nkey it made
// at enrolment, whose seed never leaves the host). The gateway checks it
// against the key it enrolled for the host and keeps it with the call's
// audit record, so the trail holds the host's word, not only the
// gateway's.
//
// It travels in the HeaderReceipt header of a result's last part:
// "RECEIPT.SIGNATURE", the base64url (no padding) of the receipt's
// canonical bytes (Receipt.SigningBytes) and of the ed25519 signature
// over them.

// HeaderReceipt carries a result's receipt.
const HeaderReceipt = "Fleet-Receipt"

// Outcomes a receipt states besides an error code (Result.Error.Code).
const (
	// OutcomeOK: the tool ran and reported success.
	OutcomeOK = "ok"
	// OutcomeToolError: the tool ran and reported failure (IsError).
	OutcomeToolError = "tool_error"
)

// Receipt is an agent's signed account of one call.
type Receipt struct {
	CallID string `json:"call_id"`
	Host   string `json:"host"`
	// Outcome is OutcomeOK, OutcomeToolError, or the code of a result
	// that carries an error (denied, busy, ...).
	Outcome string `json:"outcome"`
	// ExitCode is a command's exit status, when the call ran one to its
	// end.
	ExitCode *int `json:"exit_code,omitempty"`
	// ResultSHA256 and ResultBytes describe the encoded result
	// (EncodeResult) exactly.
	ResultSHA256 string `json:"result_sha256"`
	ResultBytes  int64  `json:"result_bytes"`
	// Start and End are when the agent took the call in and when it
	// finished it, by the host's clock.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Key is the agent's public key (an nkey, U...), Signature the
	// base64url ed25519 signature of SigningBytes.
	Key       string `json:"key"`
	Signature string `json:"signature"`
}

// OutcomeOf returns the outcome a receipt states for res.
func OutcomeOf(res *Result) string {
	switch {
	case res.Error != nil:
		return string(res.Error.Code)
	case res.IsError:
		return OutcomeToolError
	}
	return OutcomeOK
}

// NewReceipt returns the receipt (unsigned) of the result res whose
// encoding is encoded.
func NewReceipt(host string, res *Result, encoded []byte, start, end time.Time, exit *int) *Receipt {
	sum := sha256.Sum256(encoded)
	return &Receipt{CallID: res.CallID, Host: host, Outcome: OutcomeOf(res), ExitCode: exit,
		ResultSHA256: hex.EncodeToString(sum[:]), ResultBytes: int64(len(encoded)), Start: start, End: end}
}

const receiptMagic = "fleetmcp-receipt-v1\n"

// SigningBytes is what the agent signs: the magic line, then one
// "name=LEN:value\n" line per field in a fixed order (times in Unix
// nanoseconds, an absent exit code empty), the key last.
func (r *Receipt) SigningBytes() []byte {
	b := make([]byte, 0, 320)
	b = append(b, receiptMagic...)
	b = putField(b, "call", r.CallID)
	b = putField(b, "host", r.Host)
	b = putField(b, "outcome", r.Outcome)
	exit := ""
	if r.ExitCode != nil {
		exit = strconv.Itoa(*r.ExitCode)
	}
	b = putField(b, "exit", exit)
	b = putField(b, "sha256", r.ResultSHA256)
	b = putField(b, "bytes", strconv.FormatInt(r.ResultBytes, 10))
	b = putField(b, "start", strconv.FormatInt(r.Start.UnixNano(), 10))
	b = putField(b, "end", strconv.FormatInt(r.End.UnixNano(), 10))
	return putField(b, "key", r.Key)
}

// Sign sets r.Key and r.Signature: sign signs bytes with the agent's key,
// whose public key is pub (U...).
func (r *Receipt) Sign(pub string, sign func([]byte) ([]byte, error)) error {
	r.Key = pub
	sig, err := sign(r.SigningBytes())
	if err != nil {
		return fmt.Errorf("sign the receipt of call %s: %w", r.CallID, err)
	}
	r.Signature = base64.RawURLEncoding.EncodeToString(sig)
	return nil
}

// Header returns the HeaderReceipt value that carries r.
func (r *Receipt) Header() string {
	return base64.RawURLEncoding.EncodeToString(r.SigningBytes()) + "." + r.Signature
}

// MaxReceiptHeader bounds a HeaderReceipt value.
const MaxReceiptHeader = 4 << 10

// ParseReceipt reads a HeaderReceipt value. It checks the receipt's form,
// not its signature (Verify). It never panics.
func ParseReceipt(h string) (*Receipt, error) {
	if h == "" {
		return nil, errors.New("the result carries no receipt")
	}
	if len(h) > MaxReceiptHeader {
		return nil, fmt.Errorf("the receipt is %d bytes; at most %d are allowed", len(h), MaxReceiptHeader)
	}
	b64, sig, ok := strings.Cut(h, ".")
	raw, err := base64.RawURLEncoding.DecodeString(b64)
	if !ok || err != nil {
		return nil, errors.New("the receipt is not RECEIPT.SIGNATURE in base64url")
	}
	if !strings.HasPrefix(string(raw), receiptMagic) {
		return nil, errors.New("the receipt does not start with " + strconv.Quote(receiptMagic))
	}
	p := claimParser{data: raw, pos: len(receiptMagic)}
	r := &Receipt{Signature: sig}
	r.CallID = p.str("call")
	r.Host = p.str("host")
	r.Outcome = p.str("outcome")
	if exit := p.str("exit"); exit != "" && p.err == nil {
		n, err := strconv.Atoi(exit)
		if err != nil || strconv.Itoa(n) != exit {
			p.fail("the exit claim is not a number")
		}
		r.ExitCode = &n
	}
	r.ResultSHA256 = p.str("sha256")
	r.ResultBytes = p.num("bytes")
	r.Start = time.Unix(0, p.num("start"))
	r.End = time.Unix(0, p.num("end"))
	r.Key = p.str("key")
	if p.err == nil && p.pos != len(raw) {
		p.fail("data after the last field")
	}
	if p.err != nil {
		return nil, fmt.Errorf("the receipt: %w", p.err)
	}
	if err := ValidateCallID(r.CallID); err != nil {
		return nil, fmt.Errorf("the receipt's call: %w", err)
	}
	if err := ValidateHost(r.Host); err != nil {
		return nil, fmt.Errorf("the receipt's host: %w", err)
	}
	if !validDigest(r.ResultSHA256) || r.ResultBytes < 0 || len(r.Outcome) > 64 || len(r.Key) > 64 {
		return nil, errors.New("the receipt's digest, size, outcome or key is malformed")
	}
	return r, nil
}

// Verify checks that r is signed by key (an nkey user public key, U...),
// and that r names that key.
func (r *Receipt) Verify(key string) error {
	if r.Key != key {
		return fmt.Errorf("the receipt names key %s, not the host's enrolled key %s", Excerpt(r.Key), key)
	}
	pub, err := ParseUserKey(key)
	if err != nil {
		return err
	}
	sig, err := base64.RawURLEncoding.DecodeString(r.Signature)
	if err != nil || len(sig) != ed25519.SignatureSize || !ed25519.Verify(pub, r.SigningBytes(), sig) {
		return errors.New("the receipt's signature does not verify with the host's enrolled key")
	}
	return nil
}

// Matches checks that r is the receipt of the result res, encoded as
// encoded, of call id on host.
func (r *Receipt) Matches(host, id string, res *Result, encoded []byte) error {
	sum := sha256.Sum256(encoded)
	switch {
	case r.Host != host || r.CallID != id:
		return fmt.Errorf("the receipt is for call %s on %s, not %s on %s", r.CallID, r.Host, id, host)
	case r.ResultBytes != int64(len(encoded)) || r.ResultSHA256 != hex.EncodeToString(sum[:]):
		return fmt.Errorf("the receipt describes a result of %d bytes with another digest than the %d bytes received", r.ResultBytes, len(encoded))
	case r.Outcome != OutcomeOf(res):
		return fmt.Errorf("the receipt says %s, the result %s", Excerpt(r.Outcome), OutcomeOf(res))
	}
	return nil
}

// ParseUserKey decodes an nkey user public key (U...): base32 of the
// prefix byte, the 32-byte ed25519 key and a CRC-16 of both.
func ParseUserKey(s string) (ed25519.PublicKey, error) {
	raw, err := base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString(s)
	const userPrefix = 20 << 3 // 'U'
	if err != nil || len(raw) != 1+ed25519.PublicKeySize+2 || raw[0] != userPrefix {
		return nil, fmt.Errorf("%s is not an nkey user public key", Excerpt(s))
	}
	body := raw[:len(raw)-2]
	if crc16(body) != uint16(raw[len(raw)-2])|uint16(raw[len(raw)-1])<<8 {
		return nil, fmt.Errorf("%s is not an nkey user public key (bad checksum)", Excerpt(s))
	}
	return ed25519.PublicKey(body[1:]), nil
}

// crc16 is the CRC-16/XMODEM nkeys checks keys with.
func crc16(data []byte) uint16 {
	var crc uint16
	for _, b := range data {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
