package gateway

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/loglimit"
)

// This file bounds what one host can make the gateway do besides answer
// the calls sent to it: the refusal reports it sends (refusals.go) and
// the credential renewals it asks for (renew.go). A compromised host
// holds its own NATS credential and key, so it can sign whatever it
// likes; what it signs must still not fill the audit trail, the nonce
// store or the gateway's time, nor slow the other hosts. Every bound
// counts what it drops (metrics.go) and logs at most one line per host
// and bound per logEvery.

// Bounds of one host's refusal reports. An agent sends a burst of 20,
// then at most 10 a second (agent/callcheck.go), and a restarted agent
// starts with a full burst again: 10 a second with a burst of 40 never
// drops a real agent's report (only the two processes of a restart,
// both reporting at full rate for more than a few seconds, could, and
// what is dropped is counted). A host that floods gets at most 40 + 600
// reports a minute past this bound, and only those about calls this
// gateway sent it are recorded, each call's at most
// maxRefusalRecordsPerCall times: with the summaries and the renewals,
// under 1,000 records a minute however many calls it is sent. The rate
// is what bounds the trail, so it stays at the agent's own.
const (
	reportBurst              = 40
	reportPeriod             = 4 * time.Second
	maxRefusalRecordsPerCall = 3
	// reportTextMax bounds the host's text kept of a report (its reason
	// for people), in the audit trail and in the caller's error.
	reportTextMax = 300
)

// reportLimitText says the report bound for people, made once: a flood
// makes the gateway drop reports by the thousand a second, and each
// drop passes it to a log line the limiter mostly leaves out.
var reportLimitText = fmt.Sprintf("%d, then %d a second", reportBurst, int(reportBurst/reportPeriod.Seconds()))

// Bounds of one host's renewals. A credential is renewed once past half
// its life (an agent asks when a third is left, agent/renew.go); a
// request before that is answered at once and costs nothing else. The
// requests that go on to a renewal (a nonce stored, the record updated,
// a credential minted, an audit record) take a token from a bucket of
// renewBurst that refills one token per renewRefill(ttl): four an hour
// with the default thirty-day credential, one a second at most.
const (
	renewBurst     = 4
	renewRefillMin = time.Second
	renewRefillMax = 15 * time.Minute
)

// renewRefill is how often a host's renewal bucket gains a token, for
// credentials valid ttl: a quarter of ttl, within renewRefillMin and
// renewRefillMax, so that even a short-lived credential (renewed every
// two thirds of ttl) is never refused by the bucket.
func renewRefill(ttl time.Duration) time.Duration {
	return min(max(ttl/4, renewRefillMin), renewRefillMax)
}

// boundCounts counts what the per-host bounds dropped, for metrics.go.
type boundCounts struct {
	// Refusal reports: beyond the host's rate, not signed by the host's
	// key, unreadable, about no call this gateway sent the host, about a
	// call already recorded maxRefusalRecordsPerCall times, or with the
	// audit queue full.
	reportsRateLimited, reportsUnsigned, reportsMalformed, reportsNotSent, reportsCallCapped, reportsQueueFull atomic.Int64
	// Renewals answered without a renewal: asked for before half the
	// credential's life, or beyond the host's rate.
	renewalsEarly, renewalsRateLimited atomic.Int64
}

// hostBounds are the per-host limits, shared by the router (refusal
// reports) and the renewal service.
type hostBounds struct {
	now      func() time.Time
	renewTTL time.Duration

	reports  access.RateLimiters
	renewals access.RateLimiters
	logs     *loglimit.Limiter
	counts   boundCounts

	// unsent tallies, per host, the reports about messages this gateway
	// did not send, for the summary records (refusals.go).
	unsentMu sync.Mutex
	unsent   map[string]*unsentTally
}

func newHostBounds(now func() time.Time, renewTTL time.Duration) *hostBounds {
	return &hostBounds{now: now, renewTTL: renewTTL, logs: loglimit.New(logEvery, 1), unsent: make(map[string]*unsentTally)}
}

func (b *hostBounds) reportLimit() access.RateLimit {
	return access.RateLimit{N: reportBurst, Period: reportPeriod}
}

func (b *hostBounds) renewLimit() access.RateLimit {
	return access.RateLimit{N: renewBurst, Period: renewBurst * renewRefill(b.renewTTL)}
}

// renewLimitText says the renewal bound for people.
func (b *hostBounds) renewLimitText() string {
	return fmt.Sprintf("%d renewals, then one every %s", renewBurst, renewRefill(b.renewTTL))
}

// allowReport takes one of host's refusal reports from its bucket.
func (b *hostBounds) allowReport(host string) bool {
	ok, _ := b.reports.Allow(host, b.reportLimit(), b.now())
	return ok
}

// allowRenewal takes one of host's renewals from its bucket; when it is
// empty, it says how long until the next one.
func (b *hostBounds) allowRenewal(host string) (bool, time.Duration) {
	return b.renewals.Allow(host, b.renewLimit(), b.now())
}

// log writes one line about host's bound named what, at most one per
// host and bound per logEvery (the next says how many were left out).
func (b *hostBounds) log(log *slog.Logger, level slog.Level, host, what, msg string, args ...any) {
	b.logs.Log(log, level, host+"\x00"+what, msg, append([]any{"host", host}, args...)...)
}

// reportText returns a host's free text as the trail and a caller may
// see it: at most reportTextMax bytes, on one line, without control or
// format characters (which could forge line breaks in a log or reorder
// text on a screen), invalid UTF-8 replaced.
func reportText(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r == utf8.RuneError:
			return '?'
		case unicode.IsControl(r), unicode.Is(unicode.Cf, r), unicode.Is(unicode.Zl, r), unicode.Is(unicode.Zp, r):
			return ' '
		}
		return r
	}, protocol.Clip(s, 4*reportTextMax))
	return protocol.Ellipsis(strings.TrimSpace(s), reportTextMax)
}

// refusalReason returns r when it is one an agent sends, else
// "unknown": the trail's reason is one of a fixed set.
func refusalReason(r protocol.RefusalReason) string {
	switch r {
	case protocol.RefusedUnsigned, protocol.RefusedMalformed, protocol.RefusedUnknownKey, protocol.RefusedBadSignature,
		protocol.RefusedNoKeys, protocol.RefusedWrongHost, protocol.RefusedOtherInstance, protocol.RefusedMismatch,
		protocol.RefusedExpired, protocol.RefusedFuture, protocol.RefusedBeforeStart, protocol.RefusedReplayed,
		protocol.RefusedTampered, protocol.RefusedBusy:
		return string(r)
	}
	return "unknown"
}

// refusalKind returns k when it is a kind of message a gateway sends,
// else "unknown".
func refusalKind(k string) string {
	switch k {
	case protocol.MsgCall, protocol.MsgCancel, protocol.MsgFetch, protocol.MsgPoke:
		return k
	}
	return "unknown"
}

// auditCallerOf returns the audit trail's caller for c, a caller as the
// gateway sent it to a host (Identity.Caller).
func auditCallerOf(c protocol.Caller) audit.Caller {
	switch c.Issuer {
	case protocol.IssuerLocal:
		return audit.Caller{Kind: string(access.KindLocal), Subject: c.Subject}
	case protocol.IssuerAPIToken:
		return audit.Caller{Kind: string(access.KindAPIToken), Subject: strings.TrimPrefix(c.Subject, "token:")}
	}
	return audit.Caller{Kind: string(access.KindOIDC), Subject: c.Subject, Email: c.Name, ClientID: c.ClientID}
}

// unsentTally counts one host's reports about messages this gateway did
// not send it, since its last summary record.
type unsentTally struct {
	since   time.Time
	reports int
	reasons map[string]int
	kinds   map[string]int
}

// tallyUnsent counts a report of host's about a message this gateway did
// not send it. It reports whether the host had none counted: the first
// of a quiet host is recorded at once, the rest in the next summary.
func (b *hostBounds) tallyUnsent(host string, rep *protocol.Refusal) bool {
	b.unsentMu.Lock()
	defer b.unsentMu.Unlock()
	t := b.unsent[host]
	first := t == nil
	if first {
		if len(b.unsent) >= maxUnsentHosts {
			return false // counted in the metric; the next summary has room
		}
		t = &unsentTally{since: b.now(), reasons: map[string]int{}, kinds: map[string]int{}}
		b.unsent[host] = t
	}
	t.reports++
	t.reasons[refusalReason(rep.Reason)]++
	t.kinds[refusalKind(rep.Kind)]++
	return first
}

// maxUnsentHosts bounds the hosts tallied between two summaries.
const maxUnsentHosts = 4096

// takeUnsent returns the tallies counted since the last call and starts
// new ones. A host whose tally holds only the report already recorded
// at once is left out.
func (b *hostBounds) takeUnsent() map[string]*unsentTally {
	b.unsentMu.Lock()
	defer b.unsentMu.Unlock()
	out := b.unsent
	b.unsent = make(map[string]*unsentTally)
	for h, t := range out {
		if t.reports <= 1 {
			delete(out, h)
		}
	}
	return out
}

// hostConnOptions are the options of the connection the gateway hears
// hosts' refusal reports, renewal and key set requests on (hostNC):
// those of its main connection, under a name of its own, and without
// announcing itself to the agents when it reconnects (the main
// connection does).
func (g *Gateway) hostConnOptions() []nats.Option {
	return append(g.natsOptions(), nats.Name("fleet-gateway host reports"), nats.ReconnectHandler(func(nc *nats.Conn) {
		g.log.Info("NATS reconnected (host reports)", "url", nc.ConnectedUrlRedacted())
	}))
}
