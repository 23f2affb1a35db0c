package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file stores the audit records: each exactly once, and a tool
// call's before the call is answered.
//
// A tool call's answer goes to its client only once the call's record is
// in the audit stream: JetStream acknowledged it, so on a cluster a
// quorum of the stream's replicas holds it. A call whose record cannot be
// stored in time gets an error instead of its result (the record is
// still stored once the stream is back). So every call a client saw
// answered is in the trail, whatever dies afterwards; a gateway that dies
// before it answered leaves a call its client saw fail, whose record may
// or may not have been stored.
//
// A record's message ID is random, made when the record is first sent
// (dedup.go), and the stream drops a message whose ID it has seen
// within its duplicate window (auditDedupWindow): a record sent again
// because its acknowledgement was lost is stored once. A record is sent
// again with its ID as is only within auditResendSafe of its first send;
// after that the stream is searched for the ID first (headers only, from
// the first send on), and only a record not found there is sent again,
// which starts a new window. No record is stored twice. Whatever the
// stream answers "duplicate" to, or the search finds, is read back and
// must be this record, sealed and in its place in the chain: a message
// someone else stored under the record's ID does not stand for it.
//
// Records are taken from the queue in groups, without a timer: the writer
// takes every record queued at that moment and stores them one after the
// other, each chained to the one before it (chain.go), while the
// records queued meanwhile form the next group. A lone call waits one
// round trip to the stream's leader.
//
// When a record goes unacknowledged, the stream is taken to be
// unavailable (a leader election, or no quorum) until a send or a probe
// succeeds. Meanwhile new calls wait up to auditCommitWait before they
// run, and are refused without running if it does not come back: nothing
// runs on a host that the trail could not record.

const (
	// auditAttempt bounds one send's wait for its acknowledgements.
	auditAttempt = 2 * time.Second
	// auditCommitWait is how long a call waits for its record to be
	// stored, and a new call for the stream to take records again: longer
	// than a JetStream leader election (up to about 10 s).
	auditCommitWait = 15 * time.Second
	// auditDedupWindow is the stream's duplicate window; auditResendSafe
	// how long after a record's first send it may be sent again as is.
	auditDedupWindow = 2 * time.Minute
	auditResendSafe  = 90 * time.Second
	// auditRetryEvery is the pause between sends of records not stored
	// yet, and between probes of a stream that takes none.
	auditRetryEvery = 250 * time.Millisecond
	// auditBatch bounds the records of one send.
	auditBatch = 256
)

// Ticket follows one record through the writer: done is closed once
// the record is stored, or given up on (err set before).
type Ticket struct {
	done chan struct{}
	err  error
}

func newTicket() *Ticket { return &Ticket{done: make(chan struct{})} }

func (t *Ticket) finish(err error) {
	t.err = err
	close(t.done)
}

// WaitStored waits until the records of tickets (nil ones skipped) are
// stored, for at most auditCommitWait in all, or until ctx ends.
func (a *Trail) WaitStored(ctx context.Context, tickets ...*Ticket) error {
	return waitStored(ctx, a.commitWait, tickets...)
}

// waitStored waits until the records of tickets are stored, for at most
// wait in all (Trail.commitWait) or until ctx ends.
func waitStored(ctx context.Context, wait time.Duration, tickets ...*Ticket) error {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for _, t := range tickets {
		if t == nil {
			continue
		}
		select {
		case <-t.done:
			if t.err != nil {
				return t.err
			}
		case <-timer.C:
			return fmt.Errorf("the audit record was not stored within %s", wait)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// auditItem is a record to store, or a marker whose channel the writer
// closes once everything queued before it has been sent.
type auditItem struct {
	rec    *Record
	ticket *Ticket
	marker chan struct{}
}

// Write hands rec to the writer and returns its ticket. The record is
// stored after the call has finished, with its own deadlines: a caller
// that went away does not take its record with it.
func (a *Trail) Write(rec *Record) *Ticket {
	t := newTicket()
	a.closeMu.RLock()
	defer a.closeMu.RUnlock()
	if a.closed {
		a.log.Error("audit record after shutdown, not stored", "call", rec.CallID, "tool", rec.Tool, "caller", rec.Caller.Subject)
		t.finish(errors.New("the gateway is shutting down: audit record not stored"))
		return t
	}
	if rec.Gateway == "" {
		rec.Gateway = a.name
	}
	a.pending.Add(1)
	a.queue <- auditItem{rec: rec, ticket: t}
	return t
}

// Commit writes rec and waits until it is stored (at most
// auditCommitWait, or until ctx ends).
func (a *Trail) Commit(ctx context.Context, rec *Record) error {
	return waitStored(ctx, a.commitWait, a.Write(rec))
}

// Sync waits until every record queued so far has been sent once (or ctx
// ends).
func (a *Trail) Sync(ctx context.Context) error {
	marker := make(chan struct{})
	a.closeMu.RLock()
	if a.closed {
		a.closeMu.RUnlock()
		return nil
	}
	a.queue <- auditItem{marker: marker}
	a.closeMu.RUnlock()
	select {
	case <-marker:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// pendingRecord is an encoded record the stream has not acknowledged.
type pendingRecord struct {
	id     string
	data   []byte
	ticket *Ticket
	// msgID is the record's message ID (newAuditMsgID); foreign the
	// sequence of the last message found under it that was not this
	// record (reported once).
	msgID   string
	foreign uint64
	// link is the record's place in the chain as last sent: the stream
	// sequence it expects and its digest there.
	link chainLink
	// since is the first send of the record's current duplicate window
	// (zero: not sent yet); stored is set once the stream holds it.
	since  time.Time
	stored bool
}

// auditSealHeader carries an audit record's seal (Sealer).
const auditSealHeader = "Fleet-Audit-Seal"

// run stores records until the queue is closed and what is left is
// stored, or closeBy has passed.
func (a *Trail) run() {
	defer close(a.stopped)
	var pending []*pendingRecord
	open := true
	for {
		var items []auditItem
		items, open = a.collect(open, len(pending) > 0 || !a.health.up())
		recs := append(pending, a.encode(items)...)
		pending = a.send(recs)
		if len(recs) == 0 && !a.health.up() {
			a.probe()
		}
		for _, it := range items {
			if it.marker != nil {
				close(it.marker)
			}
		}
		if !open && (len(pending) == 0 || time.Now().UnixNano() > a.closeBy.Load()) {
			a.abandon(pending)
			return
		}
	}
}

// collect returns what is queued: it waits for a first item (at most
// auditRetryEvery when short, as when records wait to be sent again),
// then takes what else is there, up to auditBatch. open reports whether
// the queue is still open.
func (a *Trail) collect(open, short bool) ([]auditItem, bool) {
	if !open {
		time.Sleep(auditRetryEvery)
		return nil, false
	}
	var first auditItem
	var ok bool
	if short {
		timer := time.NewTimer(auditRetryEvery)
		select {
		case first, ok = <-a.queue:
		case <-timer.C:
			return nil, true
		}
		timer.Stop()
	} else {
		first, ok = <-a.queue
	}
	if !ok {
		return nil, false
	}
	items := []auditItem{first}
	for len(items) < auditBatch {
		select {
		case it, ok := <-a.queue:
			if !ok {
				return items, false
			}
			items = append(items, it)
		default:
			return items, true
		}
	}
	return items, true
}

// encode summarises and encodes the records of items, and appends them
// to the audit file.
func (a *Trail) encode(items []auditItem) []*pendingRecord {
	var out []*pendingRecord
	var lines []byte
	for _, it := range items {
		rec := it.rec
		if rec == nil {
			continue
		}
		if rec.RawArgs != nil {
			rec.Args, rec.RawArgs = shared().args(rec.RawArgs), nil
		}
		d, err := json.Marshal(rec)
		if err != nil {
			a.log.Error("audit record not encodable", "call", rec.CallID, "err", err)
			a.failures.Add(1)
			a.pending.Add(-1)
			it.ticket.finish(fmt.Errorf("audit record not encodable: %w", err))
			continue
		}
		out = append(out, &pendingRecord{id: rec.CallID, data: d, ticket: it.ticket, msgID: newAuditMsgID()})
		lines = append(append(lines, d...), '\n')
	}
	if len(lines) > 0 {
		a.writeFile(lines)
	}
	return out
}

// auditConflictRetries bounds how often one record is chained again
// after losing its place to another writer, in one send.
const auditConflictRetries = 16

// send stores recs one after the other, each chained to the stream's last
// record and published to be stored only right after it (the expected last
// sequence), and returns those not stored. One at a time: a group sent at
// once could not make each record depend on the one before it being
// stored (JetStream checks the expected last message ID only when a
// replicated stream applies it, and a refusal there resets the stream's
// replicas), and a record stored after its predecessor was refused would
// break the chain. Records past auditResendSafe are looked for in the
// stream first. A record that lost its place to another writer is chained
// again to the new last record at once: that is no outage.
func (a *Trail) send(recs []*pendingRecord) []*pendingRecord {
	if len(recs) == 0 {
		return nil
	}
	now := time.Now()
	var stale []*pendingRecord
	for _, r := range recs {
		if !r.since.IsZero() && now.Sub(r.since) > auditResendSafe {
			stale = append(stale, r)
		}
	}
	searched := len(stale) == 0 || a.findStored(stale) == nil
	var left []*pendingRecord
	var failed error
	for i, r := range recs {
		if failed != nil {
			left = append(left, recs[i:]...) // sent again on the next turn
			break
		}
		switch {
		case r.stored:
			a.stored(r)
			continue
		case !r.since.IsZero() && now.Sub(r.since) > auditResendSafe:
			if !searched {
				left = append(left, r) // not known yet whether the stream has it
				continue
			}
			r.since = now // not in the stream: a new window
		case r.since.IsZero():
			r.since = now
		}
		if failed = a.sendOne(r); failed != nil {
			if r.ticket.err == nil {
				left = append(left, r)
			}
		}
	}
	if failed != nil && len(left) > 0 {
		a.health.setDown(failed)
	} else if failed == nil {
		a.health.setUp()
	}
	return left
}

// sendOne stores r right after the stream's last record, chaining it
// again while other writers take that place; an error is a stream that
// did not take it (or the record given up on: r.ticket.err set).
func (a *Trail) sendOne(r *pendingRecord) error {
	for range auditConflictRetries {
		tail, err := a.chainTail()
		if err != nil {
			return err
		}
		m, opts := a.chained(r, tail)
		ctx, cancel := context.WithTimeout(context.Background(), auditAttempt)
		ack, err := a.js.PublishMsg(ctx, m, opts...)
		cancel()
		switch {
		case errors.Is(err, nats.ErrMaxPayload):
			a.giveUp(r, err)
			return err
		case isChainConflict(err):
			a.forgetTail()
			continue
		case err != nil:
			a.forgetTail()
			return err
		case ack.Duplicate:
			// Its ID was taken: by this record, stored before (its
			// acknowledgement was lost), or by a message someone else
			// stored under it. The tail is not this copy either way.
			a.forgetTail()
			mine, err := a.holdsRecord(r, ack.Sequence)
			if err != nil {
				return err
			}
			if !mine {
				a.foreignUnderID(r, ack.Sequence, "the stream answered its publish \"duplicate\"")
				continue
			}
		case ack.Sequence != r.link.seq:
			a.forgetTail()
		default:
			a.setTail(r.link)
		}
		r.stored = true
		a.stored(r)
		return nil
	}
	return fmt.Errorf("lost its place in the chain to other writers %d times", auditConflictRetries)
}

// chained returns r as a message chained to tail (the stream's last
// message as this writer knows it), and its publish options: it is stored
// only right after tail.
func (a *Trail) chained(r *pendingRecord, tail chainLink) (*nats.Msg, []jetstream.PublishOpt) {
	prev := tail.header()
	m := &nats.Msg{Subject: protocol.AuditSubject(), Data: r.data, Header: nats.Header{auditPrevHeader: {prev}}}
	seal := ""
	if a.seal != nil {
		seal = a.seal.Mark(true, r.id, chainSealInput(prev, r.data))
		m.Header.Set(auditSealHeader, seal)
	}
	seq := tail.seq + 1
	r.link = chainLink{seq: seq, digest: chainDigest(seq, prev, seal, r.data), time: a.clock.serverNow(a.stream)}
	return m, append(pubOpts(r.msgID), jetstream.WithExpectLastSequence(tail.seq))
}

// isChainConflict reports a publish refused because another record was
// stored where it expected to follow.
func isChainConflict(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return true
	}
	return false
}

// findStored searches the stream, from the earliest first send of recs
// on, for their message IDs, headers only, and marks those it holds as
// stored: a message found under a record's ID is read back, and counts
// only when it is that record (holdsRecord).
func (a *Trail) findStored(recs []*pendingRecord) error {
	ids := make(map[string]*pendingRecord, len(recs))
	found := map[*pendingRecord][]uint64{}
	from := time.Now()
	for _, r := range recs {
		ids[r.msgID] = r
		if r.since.Before(from) {
			from = r.since
		}
	}
	from = from.Add(-time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 4*jskv.Timeout)
	defer cancel()
	cons, err := a.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{protocol.AuditSubject()}, DeliverPolicy: jetstream.DeliverByStartTimePolicy,
		OptStartTime: &from, HeadersOnly: true,
	})
	if err != nil {
		return fmt.Errorf("search the audit stream: %w", err)
	}
	if info, err := cons.Info(ctx); err != nil {
		return fmt.Errorf("search the audit stream: %w", err)
	} else if info.NumPending == 0 {
		return nil // nothing stored since: none of them is there
	}
	if err := a.scanIDs(ctx, cons, ids, found); err != nil {
		return err
	}
	return a.checkFound(found)
}

// scanIDs reads cons to its end and notes, for each record of ids, the
// sequences of the messages stored under its ID.
func (a *Trail) scanIDs(ctx context.Context, cons jetstream.Consumer, ids map[string]*pendingRecord, found map[*pendingRecord][]uint64) error {
	empty := 0
	for ctx.Err() == nil {
		batch, err := cons.FetchNoWait(500)
		if err != nil {
			return fmt.Errorf("search the audit stream: %w", err)
		}
		n, done := 0, false
		for m := range batch.Messages() {
			n++
			meta, err := m.Metadata()
			if err != nil {
				continue
			}
			if r := ids[m.Headers().Get(jetstream.MsgIDHeader)]; r != nil {
				found[r] = append(found[r], meta.Sequence.Stream)
			}
			done = done || meta.NumPending == 0
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return fmt.Errorf("search the audit stream: %w", err)
		}
		switch {
		case done:
			return nil
		case n == 0:
			// Not delivered yet.
			if empty++; empty > 40 {
				return errors.New("search the audit stream: the consumer delivers nothing")
			}
			time.Sleep(50 * time.Millisecond)
		default:
			empty = 0
		}
	}
	return fmt.Errorf("search the audit stream: %w", ctx.Err())
}

// stored releases a stored record's ticket.
func (a *Trail) stored(r *pendingRecord) {
	a.pending.Add(-1)
	r.ticket.finish(nil)
}

// giveUp logs a record the stream will never take, in full.
func (a *Trail) giveUp(r *pendingRecord, err error) {
	a.pending.Add(-1)
	a.failures.Add(1)
	a.log.Error("audit record not stored in the stream", "err", err, "record", string(r.data))
	r.ticket.finish(fmt.Errorf("audit record not stored: %w", err))
}

// abandon gives up on what is left at shutdown.
func (a *Trail) abandon(recs []*pendingRecord) {
	for _, r := range recs {
		a.giveUp(r, errors.New("the gateway shut down before the audit stream took it"))
	}
}

// probe asks the stream's leader for the stream's state: an answer means
// it takes records again.
func (a *Trail) probe() {
	ctx, cancel := context.WithTimeout(context.Background(), auditAttempt)
	defer cancel()
	if _, err := a.stream.Info(ctx); err == nil {
		a.health.setUp()
	}
}

func pubOpts(id string) []jetstream.PublishOpt {
	return []jetstream.PublishOpt{jetstream.WithMsgID(id), jetstream.WithExpectStream(protocol.AuditStream)}
}

// Ready returns nil when the audit stream takes records. When it does
// not, it waits for it until commitWait after it stopped, or ctx ends,
// and then says since when and why it does not.
func (a *Trail) Ready(ctx context.Context) error {
	up, since, cause := a.health.state()
	select {
	case <-up:
		return nil
	default:
	}
	wait := a.commitWait - time.Since(since)
	if wait > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-up:
			return nil
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return &UnavailableError{Since: since, Cause: cause}
}

// UnavailableError reports an audit stream that takes no records: since
// when, and the last reason.
type UnavailableError struct {
	Since time.Time
	Cause error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("the audit trail has taken no record for %s (%v): JetStream has no leader for the audit stream, or this gateway's NATS server is cut off from a quorum of the cluster",
		time.Since(e.Since).Round(100*time.Millisecond), e.Cause)
}

func (e *UnavailableError) Unwrap() error { return e.Cause }

// auditHealth is whether the audit stream takes records.
type auditHealth struct {
	mu    sync.Mutex
	upCh  chan struct{} // closed while the stream takes records
	since time.Time     // when it stopped taking them
	cause error
}

func (h *auditHealth) init() {
	h.upCh = make(chan struct{})
	close(h.upCh)
}

func (h *auditHealth) setUp() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.upCh:
	default:
		close(h.upCh)
		h.cause = nil
	}
}

func (h *auditHealth) setDown(cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.upCh:
		h.upCh, h.since = make(chan struct{}), time.Now()
	default:
	}
	h.cause = cause
}

func (h *auditHealth) up() bool {
	up, _, _ := h.state()
	select {
	case <-up:
		return true
	default:
		return false
	}
}

func (h *auditHealth) state() (<-chan struct{}, time.Time, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.upCh, h.since, h.cause
}
