package gateway

import (
	"log/slog"
	"sync"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// A host reports a skill as tampered when the files the fleet installed
// there no longer match the signed manifest (someone changed them on the
// host's disk). The host refuses to serve them and installs the bundle
// again at its next check; the gateway makes the event part of the audit
// trail: one record per skill and report, written by the rollout
// controller's leader only (every replica reads every report), for
// reports made recently (a gateway that starts reads the last report of
// every host again).
//
// The record's tool, host and skill are the gateway's: the subject the
// report came on is the host's own (its NATS permissions allow no other),
// and the skill must be one the host's desired state names. The reason is
// the host's words and is recorded as such. A host that floods reports
// gets at most tamperAuditsPerMinute records a minute; the rest are
// counted in one log line per minute.

const (
	// tamperAuditTool names the audit records of tampered skills.
	tamperAuditTool = "skills.tampered"
	// tamperAuditsPerMinute bounds the records one host can cause.
	tamperAuditsPerMinute = 10
	// tamperReportMaxAge is how old a report may be and still be audited.
	tamperReportMaxAge = 2 * time.Minute
)

// tamperAuditor turns tampered states in status reports into audit
// records. It is safe for concurrent use.
type tamperAuditor struct {
	write  func(*audit.Record) // nil: nothing is recorded
	leader func() bool
	known  func(host, skill string) bool // the host's desired state names the skill
	log    *slog.Logger
	now    func() time.Time

	mu      sync.Mutex
	window  time.Time      // start of the current minute
	counts  map[string]int // records per host in the window
	dropped map[string]int
}

// report looks at host's new report cur, given its previous one (nil
// when none), and audits each skill that turned tampered in it.
func (a *tamperAuditor) report(host string, prev, cur *protocol.SkillStatus) {
	if a == nil || a.write == nil || !a.leader() {
		return
	}
	now := a.now()
	for name, st := range cur.Skills {
		if st.State != protocol.SkillTampered || now.Sub(st.At) > tamperReportMaxAge || st.At.After(now.Add(tamperReportMaxAge)) {
			continue
		}
		if prev != nil {
			if p, ok := prev.Skills[name]; ok && p.State == protocol.SkillTampered && p.At.Equal(st.At) {
				continue // the same event, reported again
			}
		}
		if protocol.ValidateSkillName(name) != nil || !a.known(host, name) || !a.admit(host, now) {
			continue
		}
		a.write(&audit.Record{Time: now.UTC(), CallID: newCallID(), Caller: audit.Caller{Kind: string(KindAgent), Subject: host},
			Tool: tamperAuditTool, Hosts: []string{host}, Target: name,
			Args:     map[string]any{"skill": name, "bundle_id": protocol.Clip(st.BundleID, 80), "rollout": protocol.Clip(st.Rollout, 80)},
			Decision: audit.DecisionDenied, Reason: "the host refuses the skill: its files differ from the signed manifest",
			Outcome: audit.OutcomeError, Error: protocol.Clip("reported by the host: "+st.Reason, 500)})
	}
}

// admit counts one record for host and reports whether it may be written.
func (a *tamperAuditor) admit(host string, now time.Time) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Sub(a.window) >= time.Minute {
		for h, n := range a.dropped {
			a.log.Warn("skills: a host reported more tampered skills than are audited in a minute; the rest were counted only",
				"host", h, "dropped", n, "max_per_minute", tamperAuditsPerMinute)
		}
		a.window, a.counts, a.dropped = now, map[string]int{}, map[string]int{}
	}
	if a.counts[host] >= tamperAuditsPerMinute {
		a.dropped[host]++
		return false
	}
	a.counts[host]++
	return true
}
