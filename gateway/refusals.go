package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// This file is the gateway's side of the reports hosts send of the
// messages they refused (protocol/refusal.go). A report is the host's
// word, and a compromised host can sign any report it likes: so a
// report is believed only about what the gateway knows itself. Each
// gateway hears every report; the one that sent the call a report is
// about (in flight, or among its recently sent calls) ends the call
// with the host's reason and records the refusal with its own record of
// the call: the caller, tool and arguments it sent, and of the report
// only the reason, one of a fixed set said in the gateway's words (the
// host's own text, cleaned and cut short, goes to the caller whose call
// it ended and to the log, never to the trail). A report about a
// message no call of this gateway sent that host (a forgery the host
// caught, another replica's call, or a host making things up) is
// counted, and summarised every unsentSummaryEvery per host in one
// record that names no caller and quotes nothing of the host's. Reports
// beyond the host's bound (hostbounds.go) are dropped before their
// signature is checked.

// unsentSummaryEvery is how often the reports hosts sent about messages
// no call of this gateway sent them are summarised in the trail.
const unsentSummaryEvery = 10 * time.Second

// agentServices is the goroutine that writes the refusal records.
type agentServices struct {
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// startAgentServices serves the agents' key requests and starts writing
// refusal records.
func (g *Gateway) startAgentServices() error {
	// On the connection of host requests (renew.go): a host that floods
	// them delays nothing on the main connection.
	if err := g.subsys.keys.Serve(g.conns.hostNC); err != nil {
		return err
	}
	s := &agentServices{}
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	s.wg.Go(func() { g.writeRefusals(ctx) })
	g.calling.agentSvc = s
	return nil
}

// writeRefusals writes the router's refusal records, and every
// unsentSummaryEvery the summaries of reports about messages no call of
// this gateway sent, until ctx ends.
func (g *Gateway) writeRefusals(ctx context.Context) {
	tick := time.NewTicker(unsentSummaryEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case rec := <-g.calling.router.refusalRecords:
			g.subsys.audit.Write(rec)
		case <-tick.C:
			now := g.now()
			for host, t := range g.calling.bounds.takeUnsent() {
				g.subsys.audit.Write(unsentRecord(host, t, now))
			}
		}
	}
}

func (s *agentServices) close() {
	if s == nil {
		return
	}
	s.stop()
	s.wg.Wait()
}

// onlineHosts lists the hosts online, to push the key sets to.
func (g *Gateway) onlineHosts() []string {
	var out []string
	for _, h := range g.calling.reg.list("") {
		if h.Online {
			out = append(out, h.Host)
		}
	}
	return out
}

// sentCall is the gateway's own record of a call it sent a host.
type sentCall struct {
	host, tool string
	caller     protocol.Caller
	// args are the call's arguments (nil once the call is over when they
	// were larger than recentArgsMax: the call's own record has them).
	args json.RawMessage
	// audited counts the refusal records written about the call.
	// Guarded by router.mu.
	audited int
}

// How long, and how many, finished calls are remembered for the reports
// about them (a replay of a call is refused, and reported, after it
// ended), and how much of their arguments.
const (
	recentCallsMax = 4096
	recentCallsAge = 10 * time.Minute
	recentArgsMax  = 2 << 10
)

// recentCalls are the calls a router finished lately, oldest first.
// Guarded by router.mu.
type recentCalls struct {
	byID  map[string]*sentCall
	order []recentCall
	head  int
}

type recentCall struct {
	id string
	at time.Time
}

// add remembers call id, finished at now, dropping those older than
// recentCallsAge and, beyond recentCallsMax, the oldest.
func (rc *recentCalls) add(id string, s *sentCall, now time.Time) {
	if rc.byID == nil {
		rc.byID = make(map[string]*sentCall)
	}
	for rc.head < len(rc.order) && (now.Sub(rc.order[rc.head].at) > recentCallsAge || len(rc.order)-rc.head >= recentCallsMax) {
		delete(rc.byID, rc.order[rc.head].id)
		rc.order[rc.head] = recentCall{}
		rc.head++
	}
	if rc.head > len(rc.order)/2 {
		rc.order = append(rc.order[:0], rc.order[rc.head:]...)
		rc.head = 0
	}
	if len(s.args) > recentArgsMax {
		s.args = nil
	}
	rc.byID[id] = s
	rc.order = append(rc.order, recentCall{id: id, at: now})
}

func (rc *recentCalls) get(id string) *sentCall { return rc.byID[id] }

// refusalQueue bounds the refusal records waiting for the audit writer.
const refusalQueue = 256

// onRefused hears a host's report of a message it refused (see the top
// of this file).
func (r *router) onRefused(m *nats.Msg) {
	host, ok := refusalHost(m.Subject)
	if !ok || len(m.Data) > protocol.MaxRefusalBytes {
		return
	}
	key, ok := r.hostKey(host)
	if !ok {
		return // no enrolled host: nothing to check a signature with, nor to keep a bucket for
	}
	b := r.bounds
	if !b.allowReport(host) {
		b.counts.reportsRateLimited.Add(1)
		b.log(r.log, slog.LevelWarn, host, "reports", "dropping refusal reports beyond the host's limit (its agent sends at most 10 a second)",
			"limit", reportLimitText)
		return
	}
	if err := protocol.VerifyRefusal(key, m.Data, m.Header.Get(protocol.HeaderReportSig)); err != nil {
		// Anyone who may publish here is not the host; only the host's
		// own reports are its word.
		b.counts.reportsUnsigned.Add(1)
		b.log(r.log, slog.LevelWarn, host, "unsigned", "dropping a refusal report the host did not sign", "err", err)
		return
	}
	var rep protocol.Refusal
	if err := json.Unmarshal(m.Data, &rep); err != nil || rep.Validate() != nil || rep.Host != host {
		b.counts.reportsMalformed.Add(1)
		b.log(r.log, slog.LevelWarn, host, "malformed", "dropping a malformed refusal report")
		return
	}
	rep.Message = reportText(rep.Message)
	fl, sc, record := r.sentTo(host, rep.CallID)
	if sc == nil {
		r.refusedUnsent(host, &rep)
		return
	}
	if fl != nil && (rep.Kind == protocol.MsgCall || rep.Kind == protocol.MsgFetch) && rep.Reason != protocol.RefusedOtherInstance {
		// (Another process of the host's agent, one a restart is
		// replacing, may see the call too; the one it was signed for
		// may still answer.)
		fl.mu.Lock()
		fl.refused = &rep
		fl.mu.Unlock()
		fl.wake()
	}
	if !record {
		b.counts.reportsCallCapped.Add(1)
		return
	}
	b.log(r.log, slog.LevelWarn, host, "refused", "a host refused a message of a call", "kind", refusalKind(rep.Kind),
		"reason", refusalReason(rep.Reason), "call", rep.CallID, "message", rep.Message)
	r.queueRecord(refusalRecord(host, sc, &rep, b.now()))
}

// sentTo returns this router's call id to host, in flight (fl) or
// recently finished, and whether a refusal record may still be written
// about it (which it then counts).
func (r *router) sentTo(host, id string) (fl *inflight, sc *sentCall, record bool) {
	if id == "" {
		return nil, nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if fl = r.calls[id]; fl != nil && fl.host == host {
		sc = fl.sent
	} else {
		fl = nil
		if s := r.recent.get(id); s != nil && s.host == host {
			sc = s
		}
	}
	if sc == nil || sc.audited >= maxRefusalRecordsPerCall {
		return fl, sc, false
	}
	sc.audited++
	return fl, sc, true
}

// refusedUnsent counts a report about a message this gateway did not
// send host; the first of a quiet host is recorded at once (summary).
func (r *router) refusedUnsent(host string, rep *protocol.Refusal) {
	b := r.bounds
	b.counts.reportsNotSent.Add(1)
	b.log(r.log, slog.LevelInfo, host, "unsent", "a host reported refusing a message that no call of this gateway sent it (a forgery it caught, another gateway's call, or a false report): counted, not recorded as anyone's call",
		"kind", refusalKind(rep.Kind), "reason", refusalReason(rep.Reason), "call", rep.CallID)
	if b.tallyUnsent(host, rep) {
		t := &unsentTally{since: b.now(), reports: 1, reasons: map[string]int{refusalReason(rep.Reason): 1}, kinds: map[string]int{refusalKind(rep.Kind): 1}}
		r.queueRecord(unsentRecord(host, t, b.now()))
	}
}

// queueRecord hands rec to the audit writer (writeRefusals) without
// waiting: a NATS callback never blocks.
func (r *router) queueRecord(rec *audit.Record) {
	select {
	case r.refusalRecords <- rec:
	default:
		r.bounds.counts.reportsQueueFull.Add(1)
		r.bounds.log(r.log, slog.LevelWarn, rec.Hosts[0], "queue", "refusal records dropped: the audit queue of refusals is full")
	}
}

// refusalRecord is the audit record of host's refusal rep of a message
// of call sc: the call as the gateway sent it, and of the report the
// reason (one of a fixed set, said in the gateway's words: no text of
// the host's reaches the trail) and how many the host left out.
func refusalRecord(host string, sc *sentCall, rep *protocol.Refusal, now time.Time) *audit.Record {
	kind := refusalKind(rep.Kind)
	reason := refusalReason(rep.Reason)
	text := "refused by the host: " + reasonText(reason)
	if rep.Suppressed > 0 {
		text += fmt.Sprintf(" (the host left out %d other reports)", rep.Suppressed)
	}
	// A record of its own (the trail keeps one record per id): a
	// refused copy of a call must not be taken for the call's record.
	rec := &audit.Record{Time: now.UTC(), CallID: newCallID(), Tool: sc.tool, Hosts: []string{host}, Caller: auditCallerOf(sc.caller),
		Target: "call " + rep.CallID + " (its " + kind + " message)", Decision: audit.DecisionDenied, Rule: "host envelope check",
		Reason: reason, Error: text, Outcome: audit.OutcomeRefused, Source: "refused by host " + host,
		RawArgs: sc.args}
	if sc.args == nil {
		rec.Args = map[string]any{"args": fmt.Sprintf("not kept past the call (larger than %d bytes): see the record of call %s", recentArgsMax, rep.CallID)}
	}
	return rec
}

// unsentRecord is the summary record of the reports t of host about
// messages no call of this gateway sent it: counts by reason and kind,
// no caller, no text of the host's.
func unsentRecord(host string, t *unsentTally, now time.Time) *audit.Record {
	return &audit.Record{Time: now.UTC(), CallID: newCallID(), Tool: refusedMessagesTool, Hosts: []string{host},
		Caller:   audit.Caller{Kind: string(access.KindHostReport), Subject: host},
		Decision: audit.DecisionDenied, Rule: "host envelope check", Reason: "not sent by this gateway", Outcome: audit.OutcomeRefused,
		Source: "refused by host " + host,
		Args: map[string]any{"reports": t.reports, "since": t.since.UTC().Format(time.RFC3339), "reasons": t.reasons, "kinds": t.kinds,
			"note": "messages the host says it refused that no call of this gateway sent it: not any caller's action"}}
}

// reasonText says a refusal reason (refusalReason's) in the gateway's
// words.
func reasonText(reason string) string {
	switch reason {
	case string(protocol.RefusedUnsigned):
		return "the message carried no envelope"
	case string(protocol.RefusedMalformed):
		return "its envelope could not be read"
	case string(protocol.RefusedUnknownKey):
		return "it was signed with a key the host does not trust"
	case string(protocol.RefusedBadSignature):
		return "its signature did not verify"
	case string(protocol.RefusedNoKeys):
		return "the host knows no gateway key"
	case string(protocol.RefusedWrongHost):
		return "it was signed for another host"
	case string(protocol.RefusedOtherInstance):
		return "it was signed for another process of the host's agent (one a restart replaced)"
	case string(protocol.RefusedMismatch):
		return "it was signed for another message, call or reply subject"
	case string(protocol.RefusedExpired):
		return "its envelope had expired"
	case string(protocol.RefusedFuture):
		return "it was issued further in the future than clocks may be apart"
	case string(protocol.RefusedBeforeStart):
		return "it was issued before the host's agent started"
	case string(protocol.RefusedReplayed):
		return "it was a copy of a message the host had seen already"
	case string(protocol.RefusedTampered):
		return "its body did not match the signed digest"
	case string(protocol.RefusedBusy):
		return "the host's replay cache was full"
	}
	return "for a reason this gateway does not know"
}

// refusedMessagesTool is the tool name of the summary records.
const refusedMessagesTool = "refused messages"

// refusalHost returns the host of a refusal subject.
func refusalHost(subject string) (string, bool) {
	pre, suf, _ := strings.Cut(protocol.RefusedSubjectAll, "*")
	host, ok := strings.CutPrefix(subject, pre)
	if !ok {
		return "", false
	}
	host, ok = strings.CutSuffix(host, suf)
	return host, ok && protocol.ValidateHost(host) == nil
}
