package signing

import (
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file signs the messages that make an agent act (a call, its
// cancels and fetches, a skills poke) with envelopes (protocol/envelope.go),
// and checks the receipts agents sign their results with
// (protocol/receipt.go).

// HostSigner signs the messages to one agent process: with the newest of
// the gateway's keys its host trusts, for the instance the gateway heard
// announce the host (the agent refuses another's, so a message recorded
// before a restart is never run after it).
type HostSigner struct {
	env      *protocol.EnvelopeSigner
	instance string
}

// NewHostSigner returns the signer of the messages to instance with env
// (Keys.EnvelopeSigner of the host's trusted keys).
func NewHostSigner(env *protocol.EnvelopeSigner, instance string) HostSigner {
	return HostSigner{env: env, instance: instance}
}

// Instance is the agent process the messages are for.
func (s HostSigner) Instance() string { return s.instance }

func (s HostSigner) sign(c *protocol.Claims) string {
	c.Instance = s.instance
	return s.env.Sign(c)
}

// CheckCaller refuses a caller whose claims an envelope cannot carry
// whole: a host policy may rely on any of its groups, so none is left
// out.
func CheckCaller(c *protocol.Caller) error {
	claims := protocol.Claims{Kind: protocol.MsgCall, Host: "h", Instance: "i", CallID: "c", MsgID: "m", Caller: c.Claims(),
		IssuedAt: time.UnixMilli(0), Expires: time.UnixMilli(1)}
	if err := claims.Validate(); err != nil {
		return fmt.Errorf("your token's claims cannot be passed to hosts (%v): a token with at most %d groups of at most %d bytes each is needed",
			err, protocol.MaxGroups, protocol.MaxGroupLen)
	}
	return nil
}

// SignCall returns the envelope of call c, whose encoding (all parts)
// is n bytes with SHA-256 sum, answered on reply.
func (s HostSigner) SignCall(c *protocol.Call, reply string, n int64, sum [sha256.Size]byte) string {
	now := time.Now()
	claims := protocol.Claims{
		Kind: protocol.MsgCall, Host: c.Host, CallID: c.ID, MsgID: protocol.NewMsgID(), Tool: c.Tool, Reply: reply,
		BodySHA256: sum, BodySize: n, TimeoutMS: c.TimeoutMS, Caller: c.Caller.Claims(),
		IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime),
	}
	return s.sign(&claims)
}

// SignMessage returns the envelope of a message of kind about call id to
// host, with body, answered on reply ("" for none).
func (s HostSigner) SignMessage(kind, host, id, reply string, body []byte) string {
	now := time.Now()
	claims := protocol.Claims{
		Kind: kind, Host: host, CallID: id, MsgID: protocol.NewMsgID(), Reply: reply,
		BodySHA256: sha256.Sum256(body), BodySize: int64(len(body)),
		IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime),
	}
	return s.sign(&claims)
}

// SignPoke returns the envelope of a skills poke for host (no call, no
// body, no reply).
func (s HostSigner) SignPoke(host string) string {
	now := time.Now()
	claims := protocol.Claims{Kind: protocol.MsgPoke, Host: host, MsgID: protocol.NewMsgID(), BodySHA256: sha256.Sum256(nil),
		IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime)}
	return s.sign(&claims)
}

// VerifyReceipt checks header, the receipt of the result res of call c,
// which arrived encoded as encoded, against the key hostKey gives for
// the host (false: none enrolled). It returns the receipt as parsed (nil
// when it could not be) and why it is not valid (nil: it is).
func VerifyReceipt(hostKey func(string) (string, bool), c *protocol.Call, res *protocol.Result, encoded []byte, header string) (*protocol.Receipt, error) {
	key, ok := hostKey(c.Host)
	if !ok {
		return nil, fmt.Errorf("the gateway has no enrolled key for host %s to check it with", c.Host)
	}
	rc, err := protocol.ParseReceipt(header)
	if err != nil {
		return nil, err
	}
	if err := rc.Matches(c.Host, c.ID, res, encoded); err != nil {
		return rc, err
	}
	return rc, rc.Verify(key)
}
