package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
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

// envelopeSigner returns the signer for h's messages. A host that trusts
// none of the gateway's keys is sent nothing.
func (r *router) envelopeSigner(h *HostInfo) (signing.HostSigner, error) {
	if env := r.keys.EnvelopeSigner(h.TrustedKeys); env != nil {
		return signing.NewHostSigner(env, h.Instance), nil
	}
	if len(h.TrustedKeys) == 0 {
		return signing.HostSigner{}, &HostError{Host: h.Host, Kind: HostUntrusted, Msg: fmt.Sprintf(
			"host %s cannot check the gateway's signatures: its agent knows no gateway signing key (it was enrolled before calls were signed) or is older than this gateway; "+
				"calls are refused rather than sent unsigned: upgrade its fleet-agent, or enrol it again (fleet-agent join)", h.Host)}
	}
	return signing.HostSigner{}, &HostError{Host: h.Host, Kind: HostUntrusted, Msg: fmt.Sprintf(
		"host %s does not trust the gateway's signing key %s (it trusts %s): either it has not taken in the key set of the latest rotation yet, which it asks for when it connects "+
			"(if it missed the whole rotation, enrol it again: fleet-agent join), or this gateway missed a rotation made on another replica "+
			"(copy that replica's signing directory here and reload: kill -HUP)", h.Host, r.keys.CurrentKeyID(), strings.Join(h.TrustedKeys, ", "))}
}

// cancel sends host a signed cancel of call id.
func (r *router) cancel(env signing.HostSigner, host, id, reason string) {
	data, _ := json.Marshal(protocol.Cancel{CallID: id, Reason: reason})
	m := &nats.Msg{Subject: protocol.CancelSubject(host), Data: data,
		Header: nats.Header{protocol.HeaderAuth: {env.SignMessage(protocol.MsgCancel, host, id, "", data)}}}
	if err := r.nc.PublishMsg(m); err != nil {
		r.log.Warn("send cancel failed", "host", host, "call", id, "err", err)
	}
}

// fetch asks host, in a signed message, to send the result of call id
// again.
func (r *router) fetch(env signing.HostSigner, host, id string) {
	data, _ := json.Marshal(protocol.Fetch{CallID: id})
	reply := protocol.ReplySubject(r.inbox, host)
	m := &nats.Msg{Subject: protocol.FetchSubject(host), Reply: reply, Data: data,
		Header: nats.Header{protocol.HeaderAuth: {env.SignMessage(protocol.MsgFetch, host, id, reply, data)}}}
	if err := r.nc.PublishMsg(m); err != nil {
		r.log.Warn("send fetch failed", "host", host, "call", id, "err", err)
	}
}

// checkReceipt checks the receipt header of the result res of call c,
// which arrived encoded as encoded, and records it in out (when not
// nil). A result without a valid receipt is refused: a host that checks
// the gateway's signatures signs every result it sends.
func (r *router) checkReceipt(c *protocol.Call, res *protocol.Result, encoded []byte, header string, out *audit.Receipt) error {
	rc, err := signing.VerifyReceipt(r.hostKey, c, res, encoded, header)
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
	rec, ok := g.subsys.agentIndex.Record(host)
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
	h, ok := g.calling.reg.get(host)
	if !ok {
		return
	}
	env := g.subsys.signer.EnvelopeSigner(h.TrustedKeys)
	if env == nil || h.Instance == "" {
		return
	}
	m := &nats.Msg{Subject: protocol.SkillsPokeSubject(host),
		Header: nats.Header{protocol.HeaderAuth: {signing.NewHostSigner(env, h.Instance).SignPoke(host)}}}
	if err := g.conns.nc.PublishMsg(m); err != nil {
		g.log.Debug("skills: poke failed", "host", host, "err", err)
	}
}

// SigningKeys returns the public keys agents trust for this gateway's
// signatures (protocol.FormatSigningKey): the current key first.
func (g *Gateway) SigningKeys() []string { return g.subsys.signer.Trusted() }

// SigningKeySerial returns the serial of the key set SigningKeys come
// from (0: no rotation yet).
func (g *Gateway) SigningKeySerial() uint64 {
	_, serial := g.subsys.signer.Chain()
	return serial
}

// openSigningKey loads (or makes) the signing key at start. Every
// gateway has one: calls are signed.
func (g *Gateway) openSigningKey() error {
	path := signing.KeyPath(g.cfg.SigningKeyFile, g.cfg.DataDir)
	if path == "" {
		return errors.New("the gateway needs a signing key: set --signing_key FILE (shared by the replicas; fleet-gateway nats-setup writes one) or --data_dir")
	}
	k, err := signing.Open(path, g.cfg.SigningKeyFile == "")
	if err != nil {
		return err
	}
	g.subsys.signer = k
	return nil
}
