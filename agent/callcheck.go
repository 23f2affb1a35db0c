package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/agent/callauth"
	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file is the agent's side of signed calls. Every message that
// makes the agent act (a call, a cancel, a fetch, a skills poke) must
// carry an envelope signed by a gateway key the agent trusts, for this
// host, this message and reply subject, in time and never seen before
// (agent/callauth); the agent checks it before it reads anything else of
// the message. A message that fails is never acted on: it is logged and
// reported to the gateways (protocol/refusal.go), which record it in the
// audit trail; it is answered only when its envelope's signature held,
// so that the reply subject is the gateway's (the clock refused it, or
// the agent is full). Every result the agent sends carries a receipt
// signed with its own key. The gateway keys move on with key sets
// (protocol/keyset.go), which the agent asks for when it joins, takes
// when a gateway pushes them, and stores (KeyStore).

// KeyStore keeps the gateway keys the agent trusts across restarts
// (agent/identity's Identity is one).
type KeyStore interface {
	SaveGatewayKeys(protocol.KeyState) error
}

// Bounds of the refusal reports an agent sends: a burst, then one per
// reportEvery; those beyond are counted in the next report.
const (
	reportBurst = 20
	reportEvery = 100 * time.Millisecond
)

// reporter limits the agent's refusal reports.
type reporter struct {
	mu         sync.Mutex
	tokens     float64
	last       time.Time
	suppressed int64
}

// take reports whether a report may go now, and how many were left out
// before it.
func (r *reporter) take(now time.Time) (bool, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last.IsZero() {
		r.tokens, r.last = reportBurst, now
	}
	r.tokens = min(reportBurst, r.tokens+float64(now.Sub(r.last))/float64(reportEvery))
	r.last = now
	if r.tokens < 1 {
		r.suppressed++
		return false, 0
	}
	r.tokens--
	n := r.suppressed
	r.suppressed = 0
	return true, n
}

// replyable reports whether a refusal may be answered on the message's
// reply subject: its envelope's signature held, and it was not a copy of
// a message the agent took in (which a forger could replay into a live
// call) nor changed on the way.
func replyable(reason protocol.RefusalReason) bool {
	switch reason {
	case protocol.RefusedExpired, protocol.RefusedFuture, protocol.RefusedBeforeStart, protocol.RefusedBusy:
		return true
	}
	return false
}

// refuse records a refused message of kind: a count, a log line (at
// most a few a minute per reason) and a report to the gateways.
func (a *Agent) refuse(kind string, claims *protocol.Claims, err error) {
	a.counts.refused.Add(1)
	var ee *protocol.EnvelopeError
	if !errors.As(err, &ee) {
		ee = &protocol.EnvelopeError{Reason: protocol.RefusedMalformed, Msg: err.Error()}
	}
	rep := protocol.Refusal{Host: a.cfg.Name, Kind: kind, Reason: ee.Reason, Message: protocol.Clip(ee.Msg, 2000), At: time.Now().UTC()}
	if claims != nil {
		rep.CallID, rep.Tool, rep.Caller, rep.KeyID = claims.CallID, protocol.Clip(claims.Tool, 256), protocol.Clip(claims.Caller.Subject, 256), claims.KeyID
		if protocol.ValidateCallID(rep.CallID) != nil {
			rep.CallID = ""
		}
	}
	a.refusalLogs.log(a.log, slog.LevelWarn, string(ee.Reason), "refused a message that is not the gateway's to run",
		"kind", kind, "reason", ee.Reason, "call", rep.CallID, "caller", rep.Caller, "err", ee.Msg)
	ok, suppressed := a.reports.take(time.Now())
	if !ok {
		return
	}
	rep.Suppressed = suppressed
	nc := a.nc.Load()
	if nc == nil {
		return
	}
	data, _ := json.Marshal(&rep)
	m := &nats.Msg{Subject: protocol.RefusedSubject(a.cfg.Name), Data: data}
	if a.receipts != nil {
		sig, err := a.receipts.SignReport(data)
		if err != nil {
			a.log.Debug("refusal report not sent", "err", err)
			return
		}
		m.Header = nats.Header{protocol.HeaderReportSig: {sig}}
	}
	if err := nc.PublishMsg(m); err != nil {
		a.log.Debug("refusal report not sent", "err", err)
	}
}

// refuseCall refuses call id, received with reply, answering it when the
// refusal allows (replyable).
func (a *Agent) refuseCall(reply, id string, claims *protocol.Claims, err error, seq uint64) {
	a.refuse(protocol.MsgCall, claims, err)
	var ee *protocol.EnvelopeError
	if errors.As(err, &ee) && replyable(ee.Reason) && reply != "" {
		code := protocol.CodeRefused
		if ee.Reason == protocol.RefusedBusy {
			code = protocol.CodeBusy
		}
		a.replyResult(reply, protocol.ErrorResult(id, code, fmt.Sprintf("host %s refused the call: %s", a.cfg.Name, ee.Msg)), seq)
	}
}

// receipt signs the receipt of res, encoded as data ("" when the agent
// has no key: it then runs without credentials, in tests).
func (a *Agent) receipt(res *protocol.Result, data []byte, start, end time.Time, exit *int) string {
	if a.receipts == nil {
		return ""
	}
	h, err := a.receipts.Sign(a.cfg.Name, res, data, start, end, exit)
	if err != nil {
		a.log.Error("receipt not signed", "call", res.CallID, "err", err)
		return ""
	}
	return h
}

// policyCaller is the caller of claims as host policies match it.
func policyCaller(c protocol.CallerClaims) policy.Caller {
	return policy.Caller{Issuer: c.Issuer, Subject: c.Subject, ClientID: c.ClientID, Groups: c.Groups}
}

// callerFromClaims is the caller of claims with the display name the
// call gave (which decides nothing).
func callerFromClaims(c protocol.CallerClaims, name string) protocol.Caller {
	return protocol.Caller{Subject: c.Subject, Name: name, Issuer: c.Issuer, ClientID: c.ClientID, Groups: c.Groups}
}

// policyTool is the tool whose rules decide tool: bash for the task
// tools.
func policyTool(tool string) string {
	if slices.Contains(taskToolNames(), tool) {
		return "bash"
	}
	return tool
}

func (a *Agent) onCancel(m *nats.Msg) {
	claims, err := a.auth.OpenBody(m.Header.Get(protocol.HeaderAuth), callauth.Expect{Kind: protocol.MsgCancel, Reply: m.Reply}, m.Data)
	if err != nil {
		a.refuse(protocol.MsgCancel, claims, err)
		return
	}
	var c protocol.Cancel
	if err := json.Unmarshal(m.Data, &c); err != nil || c.CallID != claims.CallID {
		a.refuse(protocol.MsgCancel, claims, fmt.Errorf("the cancel is not JSON naming the call its envelope signed: %v", err))
		return
	}
	if a.calls.cancel(c.CallID) {
		a.log.Info("call cancelled", "call", c.CallID, "reason", c.Reason)
	}
}

func (a *Agent) onFetch(m *nats.Msg) {
	claims, err := a.auth.OpenBody(m.Header.Get(protocol.HeaderAuth), callauth.Expect{Kind: protocol.MsgFetch, Reply: m.Reply}, m.Data)
	if err != nil {
		a.refuse(protocol.MsgFetch, claims, err)
		return
	}
	var f protocol.Fetch
	if err := json.Unmarshal(m.Data, &f); err != nil || f.CallID != claims.CallID || m.Reply == "" {
		a.refuse(protocol.MsgFetch, claims, fmt.Errorf("the fetch is not JSON naming the call its envelope signed, with a reply subject: %v", err))
		return
	}
	a.replyState(m.Reply, f.CallID)
}

func (a *Agent) onPoke(m *nats.Msg) {
	if claims, err := a.auth.OpenBody(m.Header.Get(protocol.HeaderAuth), callauth.Expect{Kind: protocol.MsgPoke, Reply: m.Reply}, m.Data); err != nil {
		a.refuse(protocol.MsgPoke, claims, err)
		return
	}
	a.skillSync.poke()
}

// onKeys takes in a key set chain a gateway pushed.
func (a *Agent) onKeys(m *nats.Msg) {
	a.takeKeys(m.Data, "pushed by a gateway")
}

// takeKeys takes in the newer key sets of an encoded chain it can check
// (each signed by a key the agent trusts), stores the keys and announces
// them, so that gateways sign with the newest.
func (a *Agent) takeKeys(data []byte, how string) {
	if len(data) > protocol.MaxKeySetChainBytes {
		a.log.Warn("gateway key sets ignored: larger than a chain may be", "bytes", len(data), "how", how)
		return
	}
	var chain protocol.KeySetChain
	if err := json.Unmarshal(data, &chain); err != nil {
		a.log.Warn("gateway key sets ignored: not a key set chain", "how", how, "err", err)
		return
	}
	changed, err := a.auth.Apply(&chain)
	if err != nil {
		a.refusalLogs.log(a.log, slog.LevelWarn, "keys", "gateway key sets: a set could not be checked; the keys in force stay", "how", how, "err", err)
	}
	if !changed {
		return
	}
	st := a.auth.Keys()
	a.log.Info("gateway signing keys changed", "key_set", st.Serial, "trusted", a.auth.KeyIDs(), "how", how)
	if a.cfg.KeyStore != nil {
		if err := a.cfg.KeyStore.SaveGatewayKeys(st); err != nil {
			a.log.Error("gateway signing keys not stored: after a restart the agent trusts the keys before", "err", err)
		}
	}
	if nc := a.nc.Load(); nc != nil {
		a.announce(nc, false)
	}
}

// Timing of the agent's key set requests: at every join, then about
// hourly (jittered), with a short wait for the answer.
const (
	keysCheckEvery  = time.Hour
	keysRequestWait = 5 * time.Second
)

// keysLoop asks the gateways for the key set chain whenever the agent
// joins the fleet and about hourly. It returns when ctx ends.
func (a *Agent) keysLoop(ctx context.Context) {
	timer := time.NewTimer(keysCheckEvery)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.keysJoined:
		case <-timer.C:
		}
		timer.Reset(time.Duration(float64(keysCheckEvery) * (0.75 + rand.Float64()/2)))
		nc := a.nc.Load()
		if nc == nil || !nc.IsConnected() {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, keysRequestWait)
		msg, err := nc.RequestWithContext(rctx, protocol.KeysSubject(a.cfg.Name), nil)
		cancel()
		if err != nil {
			a.log.Debug("gateway key sets not fetched", "err", err)
			continue
		}
		a.takeKeys(msg.Data, "fetched from a gateway")
	}
}

// signalKeys wakes the key loop after a (re)connect.
func (a *Agent) signalKeys() {
	select {
	case a.keysJoined <- struct{}{}:
	default:
	}
}
