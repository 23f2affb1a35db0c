package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
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

// auditor writes records to the stream and the optional file.
type auditor struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	log    *slog.Logger
	redact *redactor

	mu   sync.Mutex // serialises file writes
	file *os.File
}

// jsTimeout bounds one JetStream API call; JetStream may not answer at all
// while it elects a leader, so calls are retried rather than waited on.
const jsTimeout = 3 * time.Second

func newAuditor(nc *nats.Conn, cfg AuditConfig, log *slog.Logger) (*auditor, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("audit trail: %w", err)
	}
	a := &auditor{js: js, log: log, redact: newRedactor()}
	if a.stream, err = ensureAuditStream(js, cfg); err != nil {
		return nil, err
	}
	if cfg.File != "" {
		f, err := os.OpenFile(cfg.File, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("audit file: %w", err)
		}
		a.file = f
	}
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

// write stores rec. It is called after the call has finished, with its
// own deadline: a caller that went away does not take its record with it.
// A record that cannot be stored is logged in full instead.
func (a *auditor) write(rec *AuditRecord) {
	data, err := json.Marshal(rec)
	if err != nil {
		a.log.Error("audit record not encodable", "call", rec.CallID, "err", err)
		return
	}
	var perr error
	for attempt := 0; attempt < 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), jsTimeout)
		_, perr = a.js.Publish(ctx, protocol.AuditSubject(), data, jetstream.WithMsgID(rec.CallID), jetstream.WithExpectStream(protocol.AuditStream))
		cancel()
		if perr == nil {
			break
		}
	}
	if perr != nil {
		a.log.Error("audit record not stored in the stream", "err", perr, "record", string(data))
	}
	if a.file != nil {
		a.mu.Lock()
		_, ferr := a.file.Write(append(data, '\n'))
		a.mu.Unlock()
		if ferr != nil {
			a.log.Error("audit record not written to the file", "err", ferr, "record", string(data))
		}
	}
}

func (a *auditor) close() error {
	if a == nil || a.file == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.file.Close()
}
