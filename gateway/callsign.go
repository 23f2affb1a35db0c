package gateway

import (
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// This file is the router's side of signed calls: every message that
// makes an agent act (a call, its cancels and fetches) goes out with an
// envelope signed by the gateway's key (protocol/envelope.go), with the
// key the host announces it trusts; every result must come back with a
// receipt signed by the key the gateway enrolled for the host
// (protocol/receipt.go), or it is refused; and a host's report that it
// refused a message (protocol/refusal.go), signed with the host's key,
// ends the call it was about at once, with the host's reason
// (refusals.go).

// hostSigner signs the messages to one agent process: with the newest of
// the gateway's keys its host trusts, for the instance the gateway heard
// announce the host (the agent refuses another's, so a message recorded
// before a restart is never run after it).
type hostSigner struct {
	env      *protocol.EnvelopeSigner
	instance string
}

func (s hostSigner) sign(c *protocol.Claims) string {
	c.Instance = s.instance
	return s.env.Sign(c)
}

// envelopeSigner returns the signer for h's messages. A host that trusts
// none of the gateway's keys is sent nothing.
func (r *router) envelopeSigner(h *HostInfo) (hostSigner, error) {
	if env := r.keys.envelopeSigner(h.TrustedKeys); env != nil {
		return hostSigner{env: env, instance: h.Instance}, nil
	}
	if len(h.TrustedKeys) == 0 {
		return hostSigner{}, &HostError{Host: h.Host, Kind: HostUntrusted, Msg: fmt.Sprintf(
			"host %s cannot check the gateway's signatures: its agent knows no gateway signing key (it was enrolled before calls were signed) or is older than this gateway; "+
				"calls are refused rather than sent unsigned: upgrade its fleet-agent, or enrol it again (fleet-agent join)", h.Host)}
	}
	return hostSigner{}, &HostError{Host: h.Host, Kind: HostUntrusted, Msg: fmt.Sprintf(
		"host %s does not trust the gateway's signing key %s (it trusts %s): either it has not taken in the key set of the latest rotation yet, which it asks for when it connects "+
			"(if it missed the whole rotation, enrol it again: fleet-agent join), or this gateway missed a rotation made on another replica "+
			"(copy that replica's signing directory here and reload: kill -HUP)", h.Host, r.keys.currentKeyID(), strings.Join(h.TrustedKeys, ", "))}
}

// checkCaller refuses a caller whose claims an envelope cannot carry
// whole: a host policy may rely on any of its groups, so none is left
// out.
func checkCaller(c *protocol.Caller) error {
	claims := protocol.Claims{Kind: protocol.MsgCall, Host: "h", Instance: "i", CallID: "c", MsgID: "m", Caller: c.Claims(),
		IssuedAt: time.UnixMilli(0), Expires: time.UnixMilli(1)}
	if err := claims.Validate(); err != nil {
		return fmt.Errorf("your token's claims cannot be passed to hosts (%v): a token with at most %d groups of at most %d bytes each is needed",
			err, protocol.MaxGroups, protocol.MaxGroupLen)
	}
	return nil
}

// signCall returns the envelope of call c, whose encoding (all parts)
// is n bytes with SHA-256 sum, answered on reply.
func (r *router) signCall(hs hostSigner, c *protocol.Call, reply string, n int64, sum [sha256.Size]byte) string {
	now := time.Now()
	claims := protocol.Claims{
		Kind: protocol.MsgCall, Host: c.Host, CallID: c.ID, MsgID: protocol.NewMsgID(), Tool: c.Tool, Reply: reply,
		BodySHA256: sum, BodySize: n, TimeoutMS: c.TimeoutMS, Caller: c.Caller.Claims(),
		IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime),
	}
	return hs.sign(&claims)
}

// signMessage returns the envelope of a message of kind about call id to
// host, with body, answered on reply ("" for none).
func signMessage(hs hostSigner, kind, host, id, reply string, body []byte) string {
	now := time.Now()
	claims := protocol.Claims{
		Kind: kind, Host: host, CallID: id, MsgID: protocol.NewMsgID(), Reply: reply,
		BodySHA256: sha256.Sum256(body), BodySize: int64(len(body)),
		IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime),
	}
	return hs.sign(&claims)
}

// checkReceipt checks the receipt header of the result res of call c,
// which arrived encoded as encoded, and records it in out (when not
// nil). A result without a valid receipt is refused: a host that checks
// the gateway's signatures signs every result it sends.
func (r *router) checkReceipt(c *protocol.Call, res *protocol.Result, encoded []byte, header string, out *audit.Receipt) error {
	var rc *protocol.Receipt
	err := func() error {
		key, ok := r.hostKey(c.Host)
		if !ok {
			return fmt.Errorf("the gateway has no enrolled key for host %s to check it with", c.Host)
		}
		var err error
		if rc, err = protocol.ParseReceipt(header); err != nil {
			return err
		}
		if err := rc.Matches(c.Host, c.ID, res, encoded); err != nil {
			return err
		}
		return rc.Verify(key)
	}()
	if out != nil {
		if rc != nil {
			out.Receipt = *rc
		}
		out.Verified = err == nil
		if err != nil {
			out.Problem = err.Error()
		}
	}
	if err != nil {
		return &HostError{Host: c.Host, Kind: HostRefused, Msg: fmt.Sprintf(
			"host %s answered %s without a valid receipt (%v): the result is not passed on, and the audit trail records it", c.Host, c.Tool, err)}
	}
	return nil
}

// refusedError is the error of a call its host refused.
func refusedError(rep *protocol.Refusal, tool string) *HostError {
	return &HostError{Host: rep.Host, Kind: HostRefused, Msg: fmt.Sprintf("host %s refused the %s call (%s): %s", rep.Host, tool, rep.Reason, rep.Message)}
}

// enrolledKey returns the key the gateway enrolled for host (its agent
// record's), which the host's receipts must be signed with.
func (g *Gateway) enrolledKey(host string) (string, bool) {
	rec, ok := g.agentIndex.Record(host)
	if !ok || rec.Revoked() {
		return "", false
	}
	return rec.PublicKey, true
}

// pokeHost tells host to read its desired skills now, in a signed
// message (an agent acts on nothing unsigned). A host that cannot check
// the gateway's signatures is not poked: it reads its desired state
// when it connects and on its timer anyway.
func (g *Gateway) pokeHost(host string) {
	h, ok := g.reg.get(host)
	if !ok {
		return
	}
	env := g.signer.envelopeSigner(h.TrustedKeys)
	if env == nil || h.Instance == "" {
		return
	}
	m := &nats.Msg{Subject: protocol.SkillsPokeSubject(host),
		Header: nats.Header{protocol.HeaderAuth: {signPoke(hostSigner{env: env, instance: h.Instance}, host)}}}
	if err := g.nc.PublishMsg(m); err != nil {
		g.log.Debug("skills: poke failed", "host", host, "err", err)
	}
}

// signPoke returns the envelope of a skills poke for host (no call, no
// body, no reply).
func signPoke(hs hostSigner, host string) string {
	now := time.Now()
	claims := protocol.Claims{Kind: protocol.MsgPoke, Host: host, MsgID: protocol.NewMsgID(), BodySHA256: sha256.Sum256(nil),
		IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime)}
	return hs.sign(&claims)
}
