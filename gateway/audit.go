package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file keeps the audit trail: one record per tool call, allowed or
// refused, published to a JetStream stream that every gateway replica
// writes to and no agent can touch (agents have no JetStream
// permissions; the stream also refuses message deletes and purges), and
// optionally appended to a JSON-lines file.

// AuditConfig configures the audit trail.
type AuditConfig struct {
	// File, when set, also receives every record as one JSON line
	// (created 0600, appended).
	File string
	// Retention is how long the stream keeps records. Default 90 days.
	Retention time.Duration
	// Replicas is the stream's replica count on a NATS cluster. Default 1.
	Replicas int
}

func (c *AuditConfig) setDefaults() {
	setDur(&c.Retention, 90*24*time.Hour)
	if c.Replicas == 0 {
		c.Replicas = 1
	}
}

func (c *AuditConfig) validate() []error {
	var errs []error
	if c.Replicas < 1 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("audit stream replicas %d: use 1 to 5 (3 on a 3-node cluster)", c.Replicas))
	}
	if c.Retention < time.Hour {
		errs = append(errs, fmt.Errorf("audit retention %s is too short (minimum 1h)", c.Retention))
	}
	return errs
}

// AuditRecord is one tool call as the audit trail keeps it.
type AuditRecord struct {
	Time time.Time `json:"time"`
	// CallID is the gateway's ID for the call, also the ID under which the
	// agent knows it.
	CallID      string      `json:"call_id"`
	Caller      AuditCaller `json:"caller"`
	ProjectID   string      `json:"project_id,omitempty"`
	ExecutionID string      `json:"execution_id,omitempty"`
	WorkspaceID string      `json:"workspace_id,omitempty"`
	Tool        string      `json:"tool"`
	Hosts       []string    `json:"hosts,omitempty"`
	// Target is what an admin action or an enrolment acted on besides
	// hosts (a join token's id); Source the address the request came
	// from (fleet API requests).
	Target string `json:"target,omitempty"`
	Source string `json:"source,omitempty"`
	// Args summarises the arguments: commands and paths, never contents;
	// secret-looking values blanked.
	Args map[string]any `json:"args,omitempty"`
	// Decision is "allowed" or "denied"; Rule names the rule that decided
	// (empty when no rule granted the call), Reason says why it was denied.
	Decision string `json:"decision"`
	Rule     string `json:"rule,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// Outcome is ok, error, timed_out, cancelled or refused. ExitCode is a
	// command's exit status; Error the failure's last line.
	Outcome    string `json:"outcome"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	Error      string `json:"error,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	BytesIn    int    `json:"bytes_in"`
	BytesOut   int    `json:"bytes_out"`
	// Parent is, on the record of one host's part of a fan-out
	// (fleet_bash, fleet_read), the call ID of the fan-out.
	Parent string `json:"parent,omitempty"`
	// Fanout counts, on a fan-out's own record, its hosts per outcome
	// (succeeded, failed, timed_out, offline, denied, not_started).
	Fanout map[string]int `json:"fanout,omitempty"`
	// Receipt is the host's signed receipt of the call's result, as the
	// gateway checked it (callsign.go): Verified, or a Problem (an
	// invalid or missing receipt, whose result was refused). Nil when no
	// result arrived.
	Receipt *AuditReceipt `json:"receipt,omitempty"`

	// rawArgs are the call's arguments until the audit writer summarises
	// them into Args, off the call's path.
	rawArgs json.RawMessage
}

// AuditCaller identifies the caller in a record.
type AuditCaller struct {
	Kind     IdentityKind `json:"kind"`
	Subject  string       `json:"sub"`
	Email    string       `json:"email,omitempty"`
	ClientID string       `json:"client_id,omitempty"`
}

// Decisions and outcomes.
const (
	decisionAllowed = "allowed"
	decisionDenied  = "denied"

	outcomeOK        = "ok"
	outcomeError     = "error"
	outcomeTimedOut  = "timed_out"
	outcomeCancelled = "cancelled"
	outcomeRefused   = "refused"
)

// auditor writes records to the stream and the optional file. Calls hand
// their record to a bounded queue and return at once; one writer goroutine
// stores them in order. A full queue makes calls wait (nothing is dropped),
// and close drains it.
type auditor struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	log    *slog.Logger
	redact *redactor
	// fileMu guards file, which reopen swaps while the writer appends.
	fileMu   sync.Mutex
	file     *os.File
	filePath string
	// failures counts records the stream did not take, and batches of
	// records the file did not take.
	failures atomic.Int64

	// storeLag bounds how long after its call started a record is
	// stored: the longest call, plus time in the queue.
	storeLag time.Duration

	queue   chan auditItem
	stopped chan struct{} // closed when the writer has drained the queue
	closeMu sync.RWMutex  // senders hold it shared; closing the queue holds it alone
	closed  bool
}

// auditItem is a record to store, or a marker whose channel the writer
// closes once everything queued before it is stored.
type auditItem struct {
	rec    *AuditRecord
	marker chan struct{}
}

// auditQueueLen bounds records waiting to be stored.
const auditQueueLen = 4096

// jsTimeout bounds one JetStream API call; JetStream may not answer at all
// while it elects a leader, so calls are retried rather than waited on.
const jsTimeout = 3 * time.Second

func newAuditor(nc *nats.Conn, cfg AuditConfig, maxCall time.Duration, log *slog.Logger) (*auditor, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("audit trail: %w", err)
	}
	a := &auditor{js: js, log: log, redact: newRedactor(), storeLag: maxCall + time.Minute,
		queue: make(chan auditItem, auditQueueLen), stopped: make(chan struct{})}
	if a.stream, err = ensureAuditStream(js, cfg); err != nil {
		return nil, err
	}
	if cfg.File != "" {
		f, err := openAuditFile(cfg.File)
		if err != nil {
			return nil, err
		}
		a.file, a.filePath = f, cfg.File
	}
	go a.run()
	return a, nil
}

// ensureAuditStream creates or updates the audit stream, retrying while
// JetStream starts up.
func ensureAuditStream(js jetstream.JetStream, cfg AuditConfig) (jetstream.Stream, error) {
	sc := jetstream.StreamConfig{
		Name:        protocol.AuditStream,
		Description: "fleetmcp audit trail: one record per tool call",
		Subjects:    []string{protocol.AuditSubject()},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      cfg.Retention,
		Replicas:    cfg.Replicas,
		DenyDelete:  true,
		DenyPurge:   true,
		Duplicates:  time.Minute,
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), jsTimeout)
		s, err := js.CreateOrUpdateStream(ctx, sc)
		cancel()
		switch {
		case err == nil:
			return s, nil
		case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
			return nil, fmt.Errorf("audit trail needs JetStream, which the NATS server does not offer: enable jetstream in its configuration (see deploy/nats/cluster-node.conf)")
		case time.Now().After(deadline):
			return nil, fmt.Errorf("audit trail: create stream %s: %w", protocol.AuditStream, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// write queues rec for storing. The record is stored after the call has
// finished, with its own deadline: a caller that went away does not take
// its record with it.
func (a *auditor) write(rec *AuditRecord) {
	a.closeMu.RLock()
	defer a.closeMu.RUnlock()
	if a.closed {
		a.log.Error("audit record after shutdown, not stored", "call", rec.CallID, "tool", rec.Tool, "caller", rec.Caller.Subject)
		return
	}
	a.queue <- auditItem{rec: rec}
}

// sync waits until every record queued so far is stored (or ctx ends).
func (a *auditor) sync(ctx context.Context) error {
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

// Records are stored in batches: the writer collects what arrives within
// auditLinger of the first record (at most auditBatch), publishes them all
// without waiting for each acknowledgement, then waits for the
// acknowledgements together. On a busy gateway this spends one round trip
// per batch instead of one per call.
const (
	auditLinger = 20 * time.Millisecond
	auditBatch  = 256
)

// run stores queued records in order until the queue is closed.
func (a *auditor) run() {
	defer close(a.stopped)
	batch := make([]*AuditRecord, 0, auditBatch)
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	flush := func() {
		linger.Stop()
		a.storeBatch(batch)
		clear(batch)
		batch = batch[:0]
	}
	for {
		select {
		case it, ok := <-a.queue:
			switch {
			case !ok:
				flush()
				return
			case it.marker != nil:
				flush()
				close(it.marker)
			default:
				batch = append(batch, it.rec)
				if len(batch) == 1 {
					linger.Reset(auditLinger)
				}
				if len(batch) == auditBatch {
					flush()
				}
			}
		case <-linger.C:
			flush()
		}
	}
}

// storeBatch writes records to the stream (with the call ID as the message
// ID, so a retry is never stored twice) and to the file. A record the
// stream does not acknowledge is retried on its own; one that cannot be
// stored at all is logged in full instead.
func (a *auditor) storeBatch(recs []*AuditRecord) {
	if len(recs) == 0 {
		return
	}
	data := make([]encodedRecord, 0, len(recs))
	var lines []byte
	for _, rec := range recs {
		if rec.rawArgs != nil {
			rec.Args, rec.rawArgs = a.redact.args(rec.rawArgs), nil
		}
		d, err := json.Marshal(rec)
		if err != nil {
			a.log.Error("audit record not encodable", "call", rec.CallID, "err", err)
			continue
		}
		data = append(data, encodedRecord{id: rec.CallID, data: d})
		lines = append(append(lines, d...), '\n')
	}
	futures := make([]jetstream.PubAckFuture, len(data))
	for i, e := range data {
		futures[i], _ = a.js.PublishAsync(protocol.AuditSubject(), e.data, pubOpts(e.id)...)
	}
	deadline := time.NewTimer(jsTimeout)
	defer deadline.Stop()
	for i, f := range futures {
		ok := false
		if f != nil {
			select {
			case <-f.Ok():
				ok = true
			case <-f.Err():
			case <-deadline.C:
				deadline.Reset(0) // the rest are late too: retry them one by one
			}
		}
		if !ok {
			a.store(data[i])
		}
	}
	if len(lines) > 0 {
		a.writeFile(lines)
	}
}

func openAuditFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit file: %w", err)
	}
	return f, nil
}

// writeFile appends lines to the audit file, if there is one.
func (a *auditor) writeFile(lines []byte) {
	a.fileMu.Lock()
	defer a.fileMu.Unlock()
	if a.file == nil {
		return
	}
	if _, err := a.file.Write(lines); err != nil {
		a.failures.Add(1)
		a.log.Error("audit records not written to the file", "file", a.filePath, "err", err, "records", string(lines))
	}
}

// reopen opens the audit file's path again and writes there from now on,
// so that a file renamed away (by logrotate) is let go. Records written
// before reopen returns are in the old file, later ones in the new: none
// is lost. When the path cannot be opened, the old file is kept.
func (a *auditor) reopen() error {
	if a == nil || a.filePath == "" {
		return nil
	}
	f, err := openAuditFile(a.filePath)
	if err != nil {
		return err
	}
	a.fileMu.Lock()
	old := a.file
	a.file = f
	a.fileMu.Unlock()
	if old == nil {
		return nil
	}
	return old.Close()
}

// encodedRecord is a record ready to publish.
type encodedRecord struct {
	id   string
	data []byte
}

func pubOpts(id string) []jetstream.PublishOpt {
	return []jetstream.PublishOpt{jetstream.WithMsgID(id), jetstream.WithExpectStream(protocol.AuditStream)}
}

// store publishes one encoded record synchronously, retrying.
func (a *auditor) store(e encodedRecord) {
	opts := pubOpts(e.id)
	var perr error
	for attempt := 0; attempt < 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), jsTimeout)
		_, perr = a.js.Publish(ctx, protocol.AuditSubject(), e.data, opts...)
		cancel()
		if perr == nil {
			return
		}
	}
	a.failures.Add(1)
	a.log.Error("audit record not stored in the stream", "err", perr, "record", string(e.data))
}

// close stores what is queued (bounded by ctx) and closes the file.
func (a *auditor) close(ctx context.Context) error {
	if a == nil {
		return nil
	}
	// Senders blocked on a full queue hold the lock shared until the
	// writer makes room; closing waits for them, but shutdown does not
	// wait beyond ctx.
	go func() {
		a.closeMu.Lock()
		defer a.closeMu.Unlock()
		if !a.closed {
			a.closed = true
			close(a.queue)
		}
	}()
	select {
	case <-a.stopped:
	case <-ctx.Done():
		a.log.Warn("audit records still queued at shutdown were not stored", "queued", len(a.queue))
	}
	a.fileMu.Lock()
	defer a.fileMu.Unlock()
	if a.file == nil {
		return nil
	}
	err := a.file.Close()
	a.file = nil
	return err
}
