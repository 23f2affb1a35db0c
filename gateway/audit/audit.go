package audit

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

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file keeps the audit trail: one record per tool call, allowed or
// refused, published to a JetStream stream that every gateway replica
// writes to and no agent can touch (agents have no JetStream
// permissions; the stream also refuses message deletes and purges), and
// optionally appended to a JSON-lines file.

// Config configures the audit trail.
type Config struct {
	// File, when set, also receives every record as one JSON line
	// (created 0600, appended).
	File string
	// Retention is how long the stream keeps records. Default 90 days.
	Retention time.Duration
	// Replicas is the stream's replica count. Default (0): 3 on a NATS
	// cluster, else 1.
	Replicas int
}

// SetDefaults fills in the defaults of what is not set.
func (c *Config) SetDefaults() {
	if c.Retention == 0 {
		c.Retention = 90 * 24 * time.Hour
	}
}

// Validate returns what is wrong with c, each error saying what to do.
func (c *Config) Validate() []error {
	var errs []error
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("audit stream replicas %d: use 1 to 5 (3 on a 3-node cluster), or 0 for the default (3 on a cluster, else 1)", c.Replicas))
	}
	if c.Retention < time.Hour {
		errs = append(errs, fmt.Errorf("audit retention %s is too short (minimum 1h)", c.Retention))
	}
	return errs
}

// Record is one tool call as the audit trail keeps it.
type Record struct {
	Time time.Time `json:"time"`
	// CallID is the gateway's ID for the call, also the ID under which the
	// agent knows it.
	CallID      string   `json:"call_id"`
	Caller      Caller   `json:"caller"`
	ProjectID   string   `json:"project_id,omitempty"`
	ExecutionID string   `json:"execution_id,omitempty"`
	WorkspaceID string   `json:"workspace_id,omitempty"`
	Tool        string   `json:"tool"`
	Hosts       []string `json:"hosts,omitempty"`
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
	// gateway checked it: Verified, or a Problem (an
	// invalid or missing receipt, whose result was refused). Nil when no
	// result arrived.
	Receipt *Receipt `json:"receipt,omitempty"`
	// Gateway is the name of the gateway replica that served the call
	// (Config.Name; empty when it has none).
	Gateway string `json:"gateway,omitempty"`
	// Unsealed is set by the audit tool on a record whose seal does not
	// hold: no gateway of this fleet stored it as it reads (another user
	// of the fleet's NATS account may have), or a gateway of a version
	// that did not seal records did. Gateways never store it set.
	Unsealed bool `json:"unsealed,omitempty"`
	// Seq is, as the audit tool reads it, the record's sequence in the
	// stream (chain problems name sequences). Gateways never store it.
	Seq uint64 `json:"seq,omitempty"`

	// RawArgs are the call's arguments until the audit writer summarises
	// them into Args, off the call's path (Write). Never stored as such.
	RawArgs json.RawMessage `json:"-"`
}

// Caller identifies the caller in a record.
type Caller struct {
	// Kind says how the caller was authenticated (the gateway's identity
	// kinds: oidc, api_token, local, agent, unverified, host_report).
	Kind     string `json:"kind"`
	Subject  string `json:"sub"`
	Email    string `json:"email,omitempty"`
	ClientID string `json:"client_id,omitempty"`
}

// The caller kinds the trail itself uses: its own gap records' (a local
// identity), and an API token's, which the audit tool names "token NAME".
const (
	callerLocal    = "local"
	callerAPIToken = "api_token"
)

// Receipt is a host's receipt as the audit trail keeps it.
type Receipt struct {
	protocol.Receipt
	// Verified is set when the gateway checked it: signed by the key it
	// enrolled for the host, and describing the result it received.
	Verified bool `json:"verified"`
	// Problem says why it is not (among others: there was none).
	Problem string `json:"problem,omitempty"`
	// Recheck is, in the audit tool's answer, the outcome of checking
	// the receipt again (its verify option); never stored.
	Recheck string `json:"recheck,omitempty"`
}

// Decisions and outcomes of a record.
const (
	DecisionAllowed = "allowed"
	DecisionDenied  = "denied"

	OutcomeOK        = "ok"
	OutcomeError     = "error"
	OutcomeTimedOut  = "timed_out"
	OutcomeCancelled = "cancelled"
	OutcomeRefused   = "refused"
)

// Trail writes records to the stream and the optional file (commit.go
// says how and when), reads them back (read.go), and watches the stream
// for damage (watch.go).
type Trail struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	log    *slog.Logger
	// name is the gateway's, for the records' Gateway.
	name string
	// seal seals each record in the stream (auditSealHeader), so that the
	// audit tool can tell the gateways' records from any other writer's
	// (nil: records are not sealed).
	seal Sealer
	// fileMu guards file, which reopen swaps while the writer appends.
	fileMu   sync.Mutex
	file     *os.File
	filePath string
	// failures counts records the stream did not take, and batches of
	// records the file did not take.
	failures atomic.Int64
	// pending counts records handed to the writer and not stored yet.
	pending atomic.Int64

	// retention is how long the stream keeps records, as configured.
	retention time.Duration

	// storeLag bounds how long after its call started a record is
	// stored: the longest call, plus the time it may wait to be stored.
	storeLag time.Duration

	// health says whether the stream takes records (commit.go);
	// commitWait is how long a call waits for its record
	// (auditCommitWait).
	health     auditHealth
	commitWait time.Duration

	// tail is the stream's last message as the writer knows it, the
	// predecessor of the next record it sends (tailOK: known).
	tailMu sync.Mutex
	tail   chainLink
	tailOK bool
	// clock dates the chain links by the server's clock (chain.go).
	clock serverClock

	// watch looks for damage to the stream (watch.go).
	watch *auditWatch

	queue   chan auditItem
	stopped chan struct{} // closed when the writer has stopped
	// closeBy is when the writer gives up on records it could not store
	// (Unix nanoseconds; 0: not closing).
	closeBy atomic.Int64
	closeMu sync.RWMutex // senders hold it shared; closing the queue holds it alone
	closed  bool
}

// auditQueueLen bounds records waiting to be stored.
const auditQueueLen = 4096

// Sealer seals the records a gateway stores and checks the seals of
// those it reads: an HMAC under a key every gateway of the fleet holds
// and no NATS credential carries. A chained record's seal covers its
// link and its data (chainSealInput), an unchained one's its data alone;
// the two kinds of seal must differ for the same input.
type Sealer interface {
	// Mark returns the seal of data, the record of call callID.
	Mark(chained bool, callID string, data []byte) string
	// Holds reports whether seal is the seal of data, the record of
	// call callID.
	Holds(chained bool, callID string, data []byte, seal string) bool
}

// Options are what the gateway gives the trail besides its Config.
type Options struct {
	// Name is the gateway's, for the records' Gateway.
	Name string
	// MaxCall is the longest a call may run: a record is stored at most
	// that (and its wait to be stored) after its call started.
	MaxCall time.Duration
	// Patience is how long Open waits for JetStream to take the stream
	// (StreamPatience for a gateway on its own).
	Patience time.Duration
	// Admin, when set, updates the stream's configuration with a
	// credential allowed to (nil: the gateway may not).
	Admin StreamUpdater
	// Seal seals the records (nil: not sealed, nor checked).
	Seal Sealer
	// Log receives the trail's log lines.
	Log *slog.Logger
}

// Open opens the audit stream, waiting up to o.Patience for JetStream (a
// cluster's first start waits for all its nodes), and starts the writer
// and the watcher. Close stops them.
func Open(nc *nats.Conn, cfg Config, o Options) (*Trail, error) {
	// Acknowledgements that never come are let go, so that a long outage
	// does not fill the client's table of publishes in flight.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(2*auditAttempt))
	if err != nil {
		return nil, fmt.Errorf("audit trail: %w", err)
	}
	patience, admin, log := o.Patience, o.Admin, o.Log
	a := &Trail{js: js, log: log, name: o.Name, seal: o.Seal, storeLag: o.MaxCall + auditResendSafe, commitWait: auditCommitWait,
		queue: make(chan auditItem, auditQueueLen), stopped: make(chan struct{})}
	a.health.init()
	a.retention = cfg.Retention
	sc := auditStreamConfig(cfg)
	if a.stream, err = ensureAuditStream(js, sc, patience, admin, log); err != nil {
		return nil, err
	}
	if have := a.stream.CachedInfo(); admin == nil && have != nil && have.Config.MaxAge != sc.MaxAge && have.Config.MaxAge > 0 {
		// A retention the gateway may not change (an external cluster's
		// operator changes it with an admin credential) is the operator's
		// choice, not damage: the watcher and verify go by the stream's.
		sc.MaxAge, a.retention = have.Config.MaxAge, have.Config.MaxAge
	}
	if cfg.File != "" {
		f, err := openAuditFile(cfg.File)
		if err != nil {
			return nil, err
		}
		a.file, a.filePath = f, cfg.File
	}
	// The watcher first: the writer reports damage through it.
	a.startWatch(sc, admin)
	go a.run()
	return a, nil
}

// StreamPatience is how long a gateway on its own waits for JetStream
// to take the audit stream at start.
const StreamPatience = 20 * time.Second

// auditStreamConfig is the audit stream's configuration.
func auditStreamConfig(cfg Config) jetstream.StreamConfig {
	return jetstream.StreamConfig{
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
		Duplicates:  auditDedupWindow,
	}
}

// ensureAuditStream creates the audit stream, or finds it as sc says,
// retrying while JetStream starts up (for up to patience, saying every
// 10 s that it waits). A stream there with another configuration is
// updated when the gateway's user may (Options.Admin), else used
// as it is, and the watcher reports what differs.
func ensureAuditStream(js jetstream.JetStream, sc jetstream.StreamConfig, patience time.Duration, admin StreamUpdater, log *slog.Logger) (jetstream.Stream, error) {
	start := time.Now()
	said := start
	for {
		ctx, cancel := context.WithTimeout(context.Background(), jskv.Timeout)
		s, err := js.CreateStream(ctx, sc)
		cancel()
		switch {
		case err == nil:
			return s, nil
		case errors.Is(err, jetstream.ErrStreamNameAlreadyInUse):
			return existingAuditStream(js, sc, admin, log)
		case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
			return nil, fmt.Errorf("audit trail needs JetStream, which the NATS server does not offer: enable jetstream in its configuration (see deploy/nats/cluster-node.conf)")
		case time.Since(start) > patience:
			return nil, fmt.Errorf("audit trail: create stream %s with %d replica(s) (waited %s; a replicated stream needs that many NATS nodes up, and its first creation all of them): %w",
				protocol.AuditStream, sc.Replicas, patience.Round(time.Second), err)
		case time.Since(said) > 10*time.Second:
			said = time.Now()
			log.Info("waiting for JetStream to take the audit stream (a cluster needs a quorum of its nodes, and at its first start all of them)",
				"replicas", sc.Replicas, "waited", time.Since(start).Round(time.Second), "err", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// StreamUpdater updates the audit stream's configuration with a
// credential allowed to: the gateway's runtime NATS user may not, so
// that no credential a running gateway keeps can.
type StreamUpdater func(ctx context.Context, cfg jetstream.StreamConfig) error

// existingAuditStream opens the audit stream that is there with another
// configuration than sc, and updates it when admin is set.
func existingAuditStream(js jetstream.JetStream, sc jetstream.StreamConfig, admin StreamUpdater, log *slog.Logger) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(context.Background(), jskv.Timeout)
	defer cancel()
	s, err := js.Stream(ctx, sc.Name)
	if err != nil {
		return nil, fmt.Errorf("audit trail: open stream %s: %w", sc.Name, err)
	}
	differs := configDamage(sc, s.CachedInfo().Config)
	switch {
	case admin != nil:
		if err := admin(ctx, sc); err != nil {
			return nil, fmt.Errorf("audit trail: update stream %s: %w", sc.Name, err)
		}
	case differs != "":
		log.Warn("the audit stream's configuration differs from this gateway's, and the gateway's NATS user may not update it: update it with an admin credential",
			"stream", sc.Name, "differs", differs)
	}
	return s, nil
}

func openAuditFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit file: %w", err)
	}
	return f, nil
}

// writeFile appends lines to the audit file, if there is one.
func (a *Trail) writeFile(lines []byte) {
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

// Reopen opens the audit file's path again and writes there from now on,
// so that a file renamed away (by logrotate) is let go. Records written
// before Reopen returns are in the old file, later ones in the new: none
// is lost. When the path cannot be opened, the old file is kept.
func (a *Trail) Reopen() error {
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

// Close stores what is queued and retries what is pending until ctx
// ends, then closes the file.
func (a *Trail) Close(ctx context.Context) error {
	if a == nil {
		return nil
	}
	by := time.Now().Add(5 * time.Second)
	if d, ok := ctx.Deadline(); ok {
		by = d
	}
	a.closeBy.Store(by.UnixNano())
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
	a.stopWatch()
	select {
	case <-a.stopped:
	case <-ctx.Done():
		a.log.Warn("audit records still queued at shutdown were not stored", "queued", len(a.queue), "pending", a.pending.Load())
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

// Failures counts the records the stream did not take, and the batches
// of records the file did not take.
func (a *Trail) Failures() int64 { return a.failures.Load() }
