package skills

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file writes the hosts' desired states and reads their status
// reports.
//
// A desired state is written only by the rollout controller, with
// compare-and-swap over the revision read (retried when another write
// came first), its Revision one more than the record's before, so that
// rollouts of different skills on one host never undo each other. After
// each write the host is poked to read it (an agent away then reads it
// when it reconnects).
//
// Status reports are kept by the stream protocol.SkillsStatusStream, the
// last one per host; each gateway reads it with one ordered consumer
// into memory.

// desiredChange edits a host's desired skills; it reports whether it
// changed anything.
type desiredChange func(skills map[string]protocol.DesiredSkill) bool

// setDesired applies change to host's desired state and pokes the host,
// also when there was nothing to change: a write whose answer was lost
// (a timeout under load) is found done when it is retried, and its host
// must still hear of it. It returns the skills before the change.
func (s *Store) setDesired(ctx context.Context, host string, change desiredChange) (before map[string]protocol.DesiredSkill, err error) {
	for attempt := 0; ; attempt++ {
		cur, rev, err := s.readDesired(ctx, host)
		if err != nil {
			return nil, err
		}
		before = maps.Clone(cur.Skills)
		next := protocol.DesiredState{Host: host, Revision: cur.Revision + 1, Skills: maps.Clone(cur.Skills), At: s.now().UTC()}
		if next.Skills == nil {
			next.Skills = map[string]protocol.DesiredSkill{}
		}
		if !change(next.Skills) {
			s.opts.Poke(host)
			return before, nil
		}
		data, err := json.Marshal(&protocol.SignedDesiredState{State: next, Signature: s.signer.Sign(protocol.PurposeDesired, next.CanonicalBytes())})
		if err != nil {
			return nil, err
		}
		wctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
		if rev == 0 {
			_, err = s.desired.Create(wctx, host, data)
		} else {
			_, err = s.desired.Update(wctx, host, data, rev)
		}
		cancel()
		if err == nil {
			s.opts.Poke(host)
			return before, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) || ctx.Err() != nil || attempt > 20 {
			return nil, fmt.Errorf("write the desired skills of %s: %w", host, err)
		}
	}
}

// readDesired reads host's desired state and its revision (0: none).
func (s *Store) readDesired(ctx context.Context, host string) (protocol.DesiredState, uint64, error) {
	e, err := jskv.Retry(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return s.desired.Get(ctx, host) })
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return protocol.DesiredState{Host: host}, 0, nil
	}
	if err != nil {
		return protocol.DesiredState{}, 0, fmt.Errorf("read the desired skills of %s: %w", host, err)
	}
	var sd protocol.SignedDesiredState
	if err := json.Unmarshal(e.Value(), &sd); err != nil {
		return protocol.DesiredState{}, 0, fmt.Errorf("the desired skills of %s are damaged: %w", host, err)
	}
	// Only a record this fleet's key signed for this host is carried on:
	// whatever else is there is never signed again as this host's.
	if err := protocol.VerifyBytes(s.signer.Verifiable(), protocol.PurposeDesired, sd.State.CanonicalBytes(), sd.Signature); err != nil || sd.State.Host != host {
		s.log.Warn("skills: the desired state of a host is not one this fleet signed for it; starting it afresh", "host", host, "err", err)
		return protocol.DesiredState{Host: host, Revision: sd.State.Revision}, e.Revision(), nil
	}
	return sd.State, e.Revision(), nil
}

// statusView is a gateway's copy of the hosts' latest status reports.
type statusView struct {
	mu     sync.RWMutex
	byHost map[string]*protocol.SkillStatus
	// changed is closed (and replaced) after every report.
	changed chan struct{}
	cons    jetstream.ConsumeContext
	// onReport is called, outside mu, after each report is applied.
	onReport func(host string, prev, cur *protocol.SkillStatus)
}

// openStatusView creates the status stream and follows it with one
// ordered consumer (the last report per host, then every new one).
// onReport, when set, hears of each report with the host's previous one.
func openStatusView(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger, onReport func(host string, prev, cur *protocol.SkillStatus)) (*statusView, error) {
	cfg := jetstream.StreamConfig{Name: protocol.SkillsStatusStream, Description: "fleetmcp skill status: the last report of each host",
		Subjects: []string{protocol.SkillsStatusSubjectAll}, MaxMsgsPerSubject: 1, Storage: jetstream.FileStorage, Replicas: replicas,
		Discard: jetstream.DiscardOld, MaxMsgSize: 1 << 20}
	deadline := time.Now().Add(loadTimeout)
	var stream jetstream.Stream
	for {
		cctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
		var err error
		stream, err = js.CreateOrUpdateStream(cctx, cfg)
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("skills: status stream: %w", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	v := &statusView{byHost: map[string]*protocol.SkillStatus{}, changed: make(chan struct{}), onReport: onReport}
	cctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	cons, err := stream.OrderedConsumer(cctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy})
	if err != nil {
		return nil, fmt.Errorf("skills: status consumer: %w", err)
	}
	if v.cons, err = cons.Consume(func(m jetstream.Msg) { v.apply(m, log) }); err != nil {
		return nil, fmt.Errorf("skills: status consumer: %w", err)
	}
	return v, nil
}

// stop ends the consumer.
func (v *statusView) stop() {
	if v != nil && v.cons != nil {
		v.cons.Stop()
	}
}

func (v *statusView) apply(m jetstream.Msg, log *slog.Logger) {
	host := subjectHost(m.Subject())
	var st protocol.SkillStatus
	if err := json.Unmarshal(m.Data(), &st); err != nil || st.Host != host {
		log.Warn("skills: ignoring a status report that is not a SkillStatus of its host", "host", host, "err", err)
		return
	}
	v.mu.Lock()
	prev := v.byHost[host]
	v.byHost[host] = &st
	close(v.changed)
	v.changed = make(chan struct{})
	v.mu.Unlock()
	if v.onReport != nil {
		v.onReport(host, prev, &st)
	}
}

// get returns host's last report of skill name.
func (v *statusView) get(host, name string) (protocol.SkillState, bool) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	st, ok := v.byHost[host]
	if !ok {
		return protocol.SkillState{}, false
	}
	s, ok := st.Skills[name]
	return s, ok
}

// next returns a channel closed at the next report.
func (v *statusView) next() <-chan struct{} {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.changed
}
