package natsauth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
	"github.com/fleetmcp/fleetmcp/gateway/internal/loglimit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/seal"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The revoked keys' ledger: every agent key (and enrol credential key)
// the gateways ever revoked, one sealed message each, in a stream that
// only grows. The fleet account's revocations lose an entry once every
// credential issued for its key has expired (the account JWT must stay
// small), and the agent records can be written by any user of the
// account: an old copy of a host's record from before its revocation,
// put back after the entry was pruned, would otherwise let the key be
// issued a credential again. The ledger is what a gateway asks before
// it issues any credential; its stream refuses deletes, purges and
// rollups, and the gateways' users may not delete, update, purge or
// restore it (protectedStreams), so no key a running gateway holds can
// take an entry out. Entries without a good seal (anyone in the account
// may publish on the subject) are ignored.

const (
	revokedStream = "FLEET_REVOKED"
	// revokedMaxMsg bounds one entry.
	revokedMaxMsg = 1024
)

// sealRevoked: an entry of the ledger, keyed by the revoked key.
const sealRevoked seal.Kind = "revoked-key"

// revokedEntry is one revoked key.
type revokedEntry struct {
	Key       string    `json:"key"`
	RevokedAt time.Time `json:"revoked_at"`
	// Until is when the last credential issued for the key before its
	// revocation expires, as its gateway knew (zero: not known, never
	// pruned): an external cluster's revoker prunes the key's entry in
	// the account JWT after it.
	Until time.Time `json:"until,omitzero"`
}

// ledgerKey is what the ledger knows of one key.
type ledgerKey struct {
	at, until time.Time // until zero: for ever
}

// revokedLedger is the ledger as one gateway follows it.
type revokedLedger struct {
	js     jetstream.JetStream
	seal   *ledgerSeal
	log    *slog.Logger
	cc     jetstream.ConsumeContext
	junk   *loglimit.Limiter
	stream jetstream.Stream

	mu   sync.Mutex
	keys map[string]ledgerKey
	// seq is the stream sequence read up to.
	seq uint64
}

// openRevokedLedger creates the ledger's stream if there is none, and
// reads it whole before returning; it then follows what other gateways
// add until close, calling added (when not nil) with each key new to it
// from then on. With replicas 0 it does not create the stream, only
// follows it.
func openRevokedLedger(ctx context.Context, nc *nats.Conn, seal *ledgerSeal, replicas int, log *slog.Logger, added func(key string, at time.Time)) (*revokedLedger, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("revoked keys: %w", err)
	}
	cfg := jetstream.StreamConfig{
		Name:        revokedStream,
		Description: "fleetmcp: every agent key ever revoked (append only)",
		Subjects:    []string{protocol.RevokedKeysSubject()},
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		MaxMsgSize:  revokedMaxMsg,
		DenyDelete:  true,
		DenyPurge:   true,
		AllowRollup: false,
	}
	var s jetstream.Stream
	if replicas > 0 {
		s, err = js.CreateStream(ctx, cfg)
	}
	if replicas <= 0 || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = js.Stream(ctx, revokedStream)
	}
	if err != nil {
		return nil, fmt.Errorf("revoked keys: stream %s: %w", revokedStream, err)
	}
	if c := s.CachedInfo().Config; !c.DenyDelete || !c.DenyPurge || c.AllowRollup || c.MaxAge != 0 || c.MaxMsgs > 0 || c.MaxBytes > 0 {
		log.Error("the revoked keys' stream lets entries go (deletes, purges, rollups or limits allowed); put its configuration back with an admin credential",
			"stream", revokedStream, "deny_delete", c.DenyDelete, "deny_purge", c.DenyPurge, "allow_rollup", c.AllowRollup, "max_age", c.MaxAge, "max_msgs", c.MaxMsgs)
	}
	last := s.CachedInfo().State.LastSeq
	l := &revokedLedger{js: js, seal: seal, log: log, keys: map[string]ledgerKey{}, junk: loglimit.New(time.Minute, 1), stream: s}
	oc, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("revoked keys: %w", err)
	}
	loaded := make(chan struct{})
	var once sync.Once
	if last == 0 {
		once.Do(func() { close(loaded) })
	}
	l.cc, err = oc.Consume(func(m jetstream.Msg) {
		key, at, isNew := l.add(m)
		if md, err := m.Metadata(); err == nil {
			l.mu.Lock()
			l.seq = max(l.seq, md.Sequence.Stream)
			l.mu.Unlock()
		}
		select {
		case <-loaded:
			if isNew && added != nil {
				added(key, at)
			}
		default:
		}
		if md, err := m.Metadata(); err == nil && md.Sequence.Stream >= last {
			once.Do(func() { close(loaded) })
		}
	})
	if err != nil {
		return nil, fmt.Errorf("revoked keys: %w", err)
	}
	select {
	case <-loaded:
		return l, nil
	case <-ctx.Done():
		l.close()
		return nil, fmt.Errorf("revoked keys: stream %s not read whole: %w", revokedStream, context.Cause(ctx))
	}
}

// add takes the entry in m, if its seal holds, and reports whether its
// key is new to the ledger.
func (l *revokedLedger) add(m jetstream.Msg) (string, time.Time, bool) {
	var e revokedEntry
	key := m.Headers().Get(revokedKeyHeader)
	if err := l.seal.open(key, m.Data(), &e); err != nil || e.Key != key {
		// Anyone in the account may publish here: one line a minute.
		l.junk.Log(l.log, slog.LevelWarn, "", "entries of the revoked keys' stream not sealed by a gateway are ignored", "key", key, "err", err)
		return "", time.Time{}, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k, ok := l.keys[key]
	l.keys[key] = mergeLedgerKey(k, ok, e)
	return key, e.RevokedAt, !ok
}

// mergeLedgerKey is what the ledger knows of a key (k, if known) with
// entry e too: the earliest revocation, the latest until (for ever if
// any entry says so).
func mergeLedgerKey(k ledgerKey, known bool, e revokedEntry) ledgerKey {
	if !known {
		return ledgerKey{at: e.RevokedAt, until: e.Until}
	}
	if e.RevokedAt.Before(k.at) {
		k.at = e.RevokedAt
	}
	if k.until.IsZero() || e.Until.IsZero() {
		k.until = time.Time{}
	} else if e.Until.After(k.until) {
		k.until = e.Until
	}
	return k
}

// until returns when the last credential of a key in the ledger
// expires (zero: for ever, or not in the ledger).
func (l *revokedLedger) until(pub string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k, ok := l.keys[pub]
	return k.until, ok
}

// catchUp waits, at most until ctx ends, until the ledger has read the
// stream up to its last message now.
func (l *revokedLedger) catchUp(ctx context.Context) error {
	info, err := l.stream.Info(ctx)
	if err != nil {
		return err
	}
	for {
		l.mu.Lock()
		seq := l.seq
		l.mu.Unlock()
		if seq >= info.State.LastSeq {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// since returns the keys revoked after t, with when.
func (l *revokedLedger) since(t time.Time) map[string]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]time.Time{}
	for key, k := range l.keys {
		if k.at.After(t) {
			out[key] = k.at
		}
	}
	return out
}

// revokedKeyHeader names the key an entry is about.
const revokedKeyHeader = "Fleet-Revoked-Key"

// revokedAt reports whether the ledger holds pub, and since when.
func (l *revokedLedger) revokedAt(pub string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k, ok := l.keys[pub]
	return k.at, ok
}

// record appends the keys the ledger does not hold yet.
func (l *revokedLedger) record(ctx context.Context, keys []RevokedKey) error {
	var errs []error
	for _, k := range keys {
		if _, ok := l.revokedAt(k.Pub); ok {
			continue
		}
		e := revokedEntry{Key: k.Pub, RevokedAt: k.RevokedAt.UTC(), Until: k.until.UTC()}
		if k.until.IsZero() {
			e.Until = time.Time{}
		}
		data, err := l.seal.seal(k.Pub, e)
		if err != nil {
			return err
		}
		msg := &nats.Msg{Subject: protocol.RevokedKeysSubject(), Data: data, Header: nats.Header{}}
		msg.Header.Set(revokedKeyHeader, k.Pub)
		pctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
		// No message ID: one that anyone in the account can take first
		// would make this entry a "duplicate" that is never stored. Two
		// gateways' entries for one key are two messages, which is
		// harmless.
		_, err = l.js.PublishMsg(pctx, msg)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("key %s: %w", k.Pub, err))
			continue
		}
		l.mu.Lock()
		old, ok := l.keys[k.Pub]
		l.keys[k.Pub] = mergeLedgerKey(old, ok, e)
		l.mu.Unlock()
	}
	if len(errs) > 0 {
		return fmt.Errorf("record revoked keys in %s: %w", revokedStream, errors.Join(errs...))
	}
	return nil
}

func (l *revokedLedger) close() {
	if l.cc != nil {
		l.cc.Stop()
	}
}

// ledgerSeal seals and opens the ledger's entries: the sealed records
// of the gateways (gateway/internal/seal), of kind sealRevoked. An entry
// whose seal does not hold was not written by a gateway of the fleet.
type ledgerSeal struct{ s *seal.Seal }

// newLedgerSeal derives the sealing key from the agent signing key, as
// the gateways derive the seal of their records.
func newLedgerSeal(agentSigner nkeys.KeyPair) (*ledgerSeal, error) {
	s, err := seal.New(agentSigner)
	if err != nil {
		return nil, err
	}
	return &ledgerSeal{s: s}, nil
}

// seal encodes v, the entry of key.
func (s *ledgerSeal) seal(key string, v any) ([]byte, error) { return s.s.Seal(sealRevoked, key, v) }

// open checks data, the entry of key, and decodes it into v.
func (s *ledgerSeal) open(key string, data []byte, v any) error {
	return s.s.Open(sealRevoked, key, data, v)
}
