package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file watches the audit stream for damage: deleted (and created
// again, or not), cut at its head (purged, or max_msgs lowered), records
// deleted inside it, or its configuration changed (limits, deny flags,
// subjects). Whoever holds a credential that may do that (see the
// security model in gateway/README.md) can still do it; the gateways see it
// within auditWatchEvery, log it, count it (fleet_audit_damage_total),
// report it on /readyz, store a gap record that says what was lost and
// how it was found, and go on: a deleted stream is created again, a
// changed configuration is put back when the gateway may, and calls are
// not refused for it.

const (
	// auditWatchEvery is how often the stream's state is read: damage is
	// seen within about this.
	auditWatchEvery = 2 * time.Second
	// auditGapTool is the tool of a gap record.
	auditGapTool = "audit_gap"
	// decisionSystem is the decision of a record the gateway made of its
	// own accord (a gap record).
	decisionSystem = "system"
	// auditAgeSlack is how close to its age-out a removed record may be
	// and still count as removed by retention.
	auditAgeSlack = time.Minute
	// auditDamageKept bounds the damage reports kept for /readyz.
	auditDamageKept = 5
)

// Damage is one damage the watcher found: when, and what (as /readyz
// says it).
type Damage struct {
	At   time.Time
	What string
}

// auditWatch is the watcher's state; only the watcher's goroutine
// touches seen.
type auditWatch struct {
	want jetstream.StreamConfig
	// retention is how long records are kept (the wanted MaxAge).
	retention time.Duration
	// restore, when set, puts the wanted configuration back with a
	// credential allowed to (the runtime user may not).
	restore StreamUpdater

	seen *streamSeen // the state read last (nil: none yet)

	mu      sync.Mutex
	damages []Damage // the last auditDamageKept
	count   atomic.Int64

	stop chan struct{}
	done chan struct{}
}

// streamSeen is what the watcher read of the stream last time.
type streamSeen struct {
	created     time.Time
	first, last uint64
	firstTime   time.Time
	deleted     int
	lastTime    time.Time
	msgs        uint64
	// at is when it was read, by the server's clock.
	at                time.Time
	configProblemSeen string
	// cutReported: a cut was reported under the changed configuration
	// still in place.
	cutReported bool
}

// startWatch starts the watcher.
func (a *Trail) startWatch(want jetstream.StreamConfig, restore StreamUpdater) {
	a.watch = &auditWatch{want: want, retention: want.MaxAge, restore: restore, stop: make(chan struct{}), done: make(chan struct{})}
	go a.watchLoop()
}

// stopWatch stops the watcher and waits for it.
func (a *Trail) stopWatch() {
	if a.watch == nil {
		return
	}
	select {
	case <-a.watch.stop:
	default:
		close(a.watch.stop)
	}
	<-a.watch.done
}

func (a *Trail) watchLoop() {
	w := a.watch
	defer close(w.done)
	t := time.NewTicker(auditWatchEvery)
	defer t.Stop()
	for {
		a.checkStream()
		select {
		case <-w.stop:
			return
		case <-t.C:
		}
	}
}

// checkStream reads the stream's state once and acts on any damage.
func (a *Trail) checkStream() {
	w := a.watch
	ctx, cancel := context.WithTimeout(context.Background(), jskv.Timeout)
	defer cancel()
	info, err := a.stream.Info(ctx)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		a.streamGone(ctx)
		return
	case err != nil:
		return // unavailable: the writer's health says so
	}
	now := &streamSeen{created: info.Created, first: info.State.FirstSeq, last: info.State.LastSeq, firstTime: info.State.FirstTime,
		deleted: info.State.NumDeleted, msgs: info.State.Msgs, lastTime: info.State.LastTime, at: serverTime(info)}
	// A changed configuration that stays (not put back) is reported once,
	// and so is the cut it makes, not each record it removes after.
	ongoing := false
	if p := configDamage(w.want, info.Config); p != "" {
		ongoing = w.seen != nil && w.seen.configProblemSeen == p
		if !ongoing {
			a.damaged("the audit stream's configuration was changed: "+p, "its configuration differs from the gateway's", a.putBack(ctx))
		}
		now.configProblemSeen = p
	}
	if prev := w.seen; prev != nil {
		a.compare(ctx, prev, now, ongoing)
	}
	w.seen = now
}

// streamGone handles a deleted stream: it is created again, and a gap
// record says what was lost.
func (a *Trail) streamGone(ctx context.Context) {
	w := a.watch
	lost := "its records (none seen by this gateway yet)"
	if s := w.seen; s != nil && s.last > 0 {
		// Records this gateway stored since it last read the state are
		// lost too.
		last := max(s.last, a.storedUpTo())
		lost = fmt.Sprintf("sequences %s (%d records when last read, %d stored since)", seqRange(s.first, last), s.msgs, last-s.last)
	}
	_, err := a.js.CreateStream(ctx, w.want)
	after := "created again"
	if err != nil {
		after = "NOT created again: " + err.Error()
	}
	a.forgetTail()
	w.seen = nil
	a.damaged("the audit stream was deleted; lost "+lost, "stream info answered: stream not found", after)
}

// compare finds what happened between two readings of the stream.
func (a *Trail) compare(ctx context.Context, prev, now *streamSeen, ongoing bool) {
	switch {
	case !now.created.Equal(prev.created) || now.last < prev.last:
		a.damaged(fmt.Sprintf("the audit stream was deleted and created again (created %s, was %s); lost sequences %s (%d records)",
			now.created.UTC().Format(time.RFC3339Nano), prev.created.UTC().Format(time.RFC3339Nano), seqRange(prev.first, prev.last), prev.msgs),
			"its creation time changed", "")
		a.forgetTail()
		return
	case now.deleted > prev.deleted:
		a.damaged(fmt.Sprintf("%d records were deleted inside the audit stream (between sequences %d and %d)", now.deleted-prev.deleted, now.first, now.last),
			"its count of deleted messages grew", "")
	}
	if ongoing {
		now.cutReported = prev.cutReported
	}
	if !now.cutReported && now.first > prev.first && prev.msgs > 0 && a.cutEarly(ctx, prev, now) {
		// Under a changed configuration that stays, one report: it goes
		// on removing a record for each one stored.
		now.cutReported = now.configProblemSeen != ""
		a.damaged(fmt.Sprintf("the audit stream was cut at its head: sequences %s removed before retention (%s) would have", seqRange(prev.first, now.first-1), a.watch.retention),
			"its first sequence moved on", "")
	}
}

// cutEarly reports whether records before now.first were removed before
// retention would have: the first record left names its predecessor's
// time, or (unchained) the first record removed was not due yet. All by
// the server's clock, which stamps and ages out the records: not by this
// gateway's, nor by that of the gateway that wrote the link, either of
// which may be off.
func (a *Trail) cutEarly(ctx context.Context, prev, now *streamSeen) bool {
	// Records within auditAgeSlack of their age-out count as aged out.
	due := now.at.Add(-a.watch.retention + auditAgeSlack)
	if now.msgs > 0 {
		if m, err := a.stream.GetMsg(ctx, now.first); err == nil {
			if l, err := parseChainLink(m.Header.Get(auditPrevHeader)); err == nil && !l.time.IsZero() {
				return linkTime(l, m.Time).After(due)
			}
		}
	}
	return prev.firstTime.After(due)
}

// putBack puts the wanted configuration back, when the gateway may, and
// says the outcome.
func (a *Trail) putBack(ctx context.Context) string {
	w := a.watch
	if w.restore == nil {
		return "not put back: this gateway's NATS user may not update the stream; put it back with an admin credential (see README, Audit)"
	}
	if err := w.restore(ctx, w.want); err != nil {
		return "NOT put back: " + err.Error()
	}
	return "put back"
}

// configDamage says how cfg differs from want in what keeps records
// ("": it does not).
func configDamage(want, cfg jetstream.StreamConfig) string {
	var d []string
	diff := func(what string, w, c any) {
		if fmt.Sprint(w) != fmt.Sprint(c) {
			d = append(d, fmt.Sprintf("%s %v (want %v)", what, c, w))
		}
	}
	norm := func(v int64) int64 {
		if v <= 0 {
			return -1
		}
		return v
	}
	diff("max_msgs", norm(want.MaxMsgs), norm(cfg.MaxMsgs))
	diff("max_bytes", norm(want.MaxBytes), norm(cfg.MaxBytes))
	diff("max_msgs_per_subject", norm(want.MaxMsgsPerSubject), norm(cfg.MaxMsgsPerSubject))
	diff("max_age", want.MaxAge, cfg.MaxAge)
	diff("deny_delete", want.DenyDelete, cfg.DenyDelete)
	diff("deny_purge", want.DenyPurge, cfg.DenyPurge)
	diff("allow_rollup_hdrs", want.AllowRollup, cfg.AllowRollup)
	diff("discard", want.Discard, cfg.Discard)
	diff("retention", want.Retention, cfg.Retention)
	diff("sealed", want.Sealed, cfg.Sealed)
	if !slices.Equal(want.Subjects, cfg.Subjects) {
		d = append(d, fmt.Sprintf("subjects %v (want %v)", cfg.Subjects, want.Subjects))
	}
	if cfg.SubjectTransform != nil {
		d = append(d, "a subject transform")
	}
	return strings.Join(d, ", ")
}

// damaged alerts: a log line, the metric, /readyz, and a gap record in
// the stream.
func (a *Trail) damaged(what, how, after string) {
	detail := a.alarm(what, how, after, "someone with a fleet account credential, or the operator and system keys, changed the audit stream: see README, Audit")
	rec := &Record{Time: time.Now().UTC(), CallID: newRecordID(), Tool: auditGapTool, Caller: Caller{Kind: callerLocal, Subject: "fleet-gateway"},
		Decision: decisionSystem, Rule: "audit stream watch", Reason: detail, Outcome: OutcomeError, Target: "stream " + protocol.AuditStream}
	// Not waited on: the writer stores it as soon as the stream takes
	// records.
	a.Write(rec)
}

// alarm reports damage without a gap record (nothing was lost, or the
// writer itself found it and must not wait on its own queue): a log
// line, the metric, /readyz. It returns the damage as /readyz says it.
func (a *Trail) alarm(what, how, after, hint string) string {
	detail := what
	if how != "" {
		detail += "; detected because " + how
	}
	if after != "" {
		detail += "; stream " + after
	}
	a.log.Error("AUDIT TRAIL DAMAGED: "+what, "detected", how, "action", after, "hint", hint)
	w := a.watch
	if w == nil {
		return detail
	}
	w.count.Add(1)
	w.mu.Lock()
	w.damages = append(w.damages, Damage{At: time.Now(), What: detail})
	if len(w.damages) > auditDamageKept {
		w.damages = w.damages[len(w.damages)-auditDamageKept:]
	}
	w.mu.Unlock()
	return detail
}

// Damages returns the damage found so far (the last few; nil: none) and
// how many times it was found.
func (a *Trail) Damages() ([]Damage, int64) {
	if a == nil || a.watch == nil {
		return nil, 0
	}
	w := a.watch
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.damages), w.count.Load()
}

// storedUpTo returns the sequence of the last record the writer knows
// stored (0: not known).
func (a *Trail) storedUpTo() uint64 {
	a.tailMu.Lock()
	defer a.tailMu.Unlock()
	if !a.tailOK {
		return 0
	}
	return a.tail.seq
}

// newRecordID returns a new ID for a record the trail makes of its own
// accord, in the form of the gateway's call IDs.
func newRecordID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "c" + hex.EncodeToString(b)
}
