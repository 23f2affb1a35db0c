package skills

import (
	"log/slog"
	"sync"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A host reports a skill as tampered when the files the fleet installed
// there no longer match the signed manifest (someone changed them on the
// host's disk). The host refuses to serve them and installs the bundle
// again at its next check; the gateway makes the event part of the audit
// trail (Options.Tampered): one event per skill and report, told by the
// rollout controller's leader only (every replica reads every report),
// for reports made recently (a gateway that starts reads the last report
// of every host again).
//
// The event's host and skill are the gateway's: the subject the report
// came on is the host's own (its NATS permissions allow no other), and
// the skill must be one the host's desired state names. The reason is
// the host's words and is passed on as such. A host that floods reports
// gets at most tamperAuditsPerMinute events a minute; the rest are
// counted in one log line per minute.

const (
	// tamperAuditsPerMinute bounds the events one host can cause.
	tamperAuditsPerMinute = 10
	// tamperReportMaxAge is how old a report may be and still be audited.
	tamperReportMaxAge = 2 * time.Minute
)

// Tampered is a host's report that the files of a skill the fleet
// installed there differ from the signed manifest.
type Tampered struct {
	// At is when the gateway heard of it.
	At time.Time
	// Host is the host that reported it; Skill a skill its desired state
	// names.
	Host, Skill string
	// BundleID and Rollout are the host's words of what it had
	// installed, Reason its words of what differs: unchecked, unclipped.
	BundleID, Rollout, Reason string
}

// tamperAuditor turns tampered states in status reports into Tampered
// events. It is safe for concurrent use.
type tamperAuditor struct {
	write  func(Tampered) // nil: nothing is told
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
		a.write(Tampered{At: now, Host: host, Skill: name, BundleID: st.BundleID, Rollout: st.Rollout, Reason: st.Reason})
	}
}

// admit counts one event for host and reports whether it may be told.
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
