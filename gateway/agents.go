package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
)

// This file keeps the agent records: one per enrolled host in the
// JetStream key-value bucket protocol.AgentsBucket (key = host ID), with
// the host's public key, the labels the operator gave it (the only labels
// access rules and selectors use) and whether it was revoked. A revoked
// record keeps its key and revocation time for ever, and a record whose
// key was replaced keeps the old key among its revoked keys, so that no
// credential is ever issued again for a revoked key and the fleet
// account's revocations can always be rebuilt from the records.
//
// Writes use compare-and-swap (create for a new host, update over the
// revision read), so two gateway replicas never both win. Every gateway
// watches the bucket (agents never do: they have no JetStream
// permissions) and keeps an index of it for the registry, and to react
// when a record turns revoked.

// AgentRecord is an enrolled host.
type AgentRecord struct {
	Host string `json:"host"`
	// PublicKey is the agent's nkey user public key (U...). Its seed never
	// leaves the host.
	PublicKey string `json:"public_key"`
	// Labels are the host's labels as the operator set them.
	Labels map[string]string `json:"labels,omitempty"`
	// TokenID is the join token the host enrolled with (empty for local
	// enrolment), and TokenAt when it last spent a use of it: within the
	// enrolment retry window after that, the same key with the same token
	// gets a credential again without spending another use.
	TokenID    string    `json:"token_id,omitempty"`
	TokenAt    time.Time `json:"token_at,omitzero"`
	EnrolledAt time.Time `json:"enrolled_at"`
	// CredentialExpiresAt is the latest expiry of any credential issued
	// for PublicKey; it never goes down.
	CredentialExpiresAt time.Time `json:"credential_expires_at"`
	// RevokedAt is when the host was revoked (zero: it is not), by whom.
	RevokedAt      time.Time           `json:"revoked_at,omitzero"`
	RevokedBy      string              `json:"revoked_by,omitempty"`
	RecoveriesLeft int                 `json:"recoveries_left"`
	Facts          protocol.AgentFacts `json:"facts,omitzero"`
	// RevokedKeys are the host's earlier keys, revoked when another key
	// replaced them.
	RevokedKeys []RevokedKey `json:"revoked_keys,omitempty"`
	// IdentityConflict is set when two clients were found on the host's
	// identity (connwatch.go). Calls to the host are refused, by every
	// gateway and across restarts, while the record still has the key it
	// names and is not revoked: revoking the host or re-enrolling it
	// with --replace (another key) ends it.
	IdentityConflict *RecordedConflict `json:"identity_conflict,omitempty"`
	// Gen counts the record's writes (1 when created). Records are
	// sealed (recordseal.go), but an old sealed copy put back into the
	// bucket would still pass its seal: the gateways take no record
	// whose Gen is not above the one they hold.
	Gen uint64 `json:"gen"`
}

// RevokedKey is a key a host no longer uses.
type RevokedKey struct {
	PublicKey           string    `json:"public_key"`
	RevokedAt           time.Time `json:"revoked_at"`
	RevokedBy           string    `json:"revoked_by,omitempty"`
	CredentialExpiresAt time.Time `json:"credential_expires_at"`
}

// RecordedConflict is an identity conflict as a host's record keeps it.
type RecordedConflict struct {
	PublicKey string    `json:"public_key"`
	FoundAt   time.Time `json:"found_at"`
	Detail    string    `json:"detail"`
}

// conflictStands returns the record's identity conflict while it stands:
// it names the key the record holds, and the host is not revoked.
func (r *AgentRecord) conflictStands() (*RecordedConflict, bool) {
	ic := r.IdentityConflict
	if ic == nil || r.Revoked() || ic.PublicKey != r.PublicKey {
		return nil, false
	}
	return ic, true
}

// Revoked reports whether the host was revoked.
func (r *AgentRecord) Revoked() bool { return !r.RevokedAt.IsZero() }

// clone returns a copy of r that shares no maps or slices with it.
func (r *AgentRecord) clone() AgentRecord {
	c := *r
	c.Labels = maps.Clone(r.Labels)
	c.RevokedKeys = slices.Clone(r.RevokedKeys)
	if r.IdentityConflict != nil {
		ic := *r.IdentityConflict
		c.IdentityConflict = &ic
	}
	return c
}

// revokedKeys lists the record's revoked keys: its earlier keys, and its
// current one when the host is revoked.
func (r *AgentRecord) revokedKeys() []natsauth.RevokedKey {
	var out []natsauth.RevokedKey
	for _, k := range r.RevokedKeys {
		out = append(out, natsauth.RevokedKey{Pub: k.PublicKey, RevokedAt: k.RevokedAt, Expires: k.CredentialExpiresAt})
	}
	if r.Revoked() {
		out = append(out, natsauth.RevokedKey{Pub: r.PublicKey, RevokedAt: r.RevokedAt, Expires: r.CredentialExpiresAt})
	}
	return out
}

// Errors of the agent records.
var (
	// ErrUnknownAgent: no host of that name was ever enrolled.
	ErrUnknownAgent = errors.New("unknown agent")
	// errRecordChanged: another write came first (create of an existing
	// record, update over an old revision).
	errRecordChanged = errors.New("agent record changed meanwhile")
)

// agentIndex is the gateway's copy of the agent records, kept by the
// bucket's watch.
type agentIndex struct {
	mu     sync.RWMutex
	byHost map[string]*AgentRecord
	// byKey maps every key ever enrolled (current and revoked) to its
	// host.
	byKey map[string]string
	rev   uint64 // the highest revision applied
	// revoked is told about every host whose record turns revoked or
	// gets a newly revoked key.
	revoked func(host string)
	// applied is closed (and replaced) after every change.
	applied chan struct{}
}

func newAgentIndex() *agentIndex {
	return &agentIndex{byHost: make(map[string]*AgentRecord), byKey: make(map[string]string), applied: make(chan struct{}, 1)}
}

// record returns host's record; the caller must not modify it.
func (x *agentIndex) record(host string) (*AgentRecord, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r, ok := x.byHost[host]
	return r, ok
}

// keyHost returns the host a key was enrolled for.
func (x *agentIndex) keyHost(pub string) (string, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	h, ok := x.byKey[pub]
	return h, ok
}

// keysOf returns every key ever enrolled for host as far as the index
// knows, even when its record was removed since.
func (x *agentIndex) keysOf(host string) []string {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var out []string
	for k, h := range x.byKey {
		if h == host {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// all returns every record, sorted by host.
func (x *agentIndex) all() []AgentRecord {
	x.mu.RLock()
	out := make([]AgentRecord, 0, len(x.byHost))
	for _, r := range x.byHost {
		out = append(out, r.clone())
	}
	x.mu.RUnlock()
	slices.SortFunc(out, func(a, b AgentRecord) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// apply takes in one entry of the bucket (rec nil: the record was
// removed).
func (x *agentIndex) apply(host string, rev uint64, rec *AgentRecord) {
	x.mu.Lock()
	old := x.byHost[host]
	if rec != nil && old != nil && old.Gen > 0 && rec.Gen <= old.Gen {
		// An old copy of the record put back (by whoever can write the
		// bucket): the record held stays.
		x.rev = max(x.rev, rev)
		close(x.applied)
		x.applied = make(chan struct{})
		x.mu.Unlock()
		return
	}
	if rec == nil {
		delete(x.byHost, host)
	} else {
		x.byHost[host] = rec
		x.byKey[rec.PublicKey] = host
		for _, k := range rec.RevokedKeys {
			x.byKey[k.PublicKey] = host
		}
	}
	x.rev = max(x.rev, rev)
	notify := x.revoked
	close(x.applied)
	x.applied = make(chan struct{})
	x.mu.Unlock()
	if notify != nil && rec != nil && newlyRevoked(old, rec) {
		notify(host)
	}
}

// wrote takes in a record this gateway has just stored, before the
// watch delivers it. The bucket keeps one entry per host, so a write over
// it soon after (an old copy put back by whoever can write the bucket)
// may replace it before the watch reads it, and the index would then keep
// the record before. rev is the write's revision: once the watch has
// reached it, what the watch took in is newer (a removal, say) and
// stands. It leaves the revision the watch reached as it is: sync still
// waits for the watch.
func (x *agentIndex) wrote(rec *AgentRecord, rev uint64) {
	x.mu.Lock()
	old := x.byHost[rec.Host]
	if x.rev >= rev || old != nil && old.Gen > 0 && rec.Gen <= old.Gen {
		x.mu.Unlock()
		return
	}
	x.byHost[rec.Host] = rec
	x.byKey[rec.PublicKey] = rec.Host
	for _, k := range rec.RevokedKeys {
		x.byKey[k.PublicKey] = rec.Host
	}
	notify := x.revoked
	close(x.applied)
	x.applied = make(chan struct{})
	x.mu.Unlock()
	if notify != nil && newlyRevoked(old, rec) {
		notify(rec.Host)
	}
}

// pass counts revision rev as seen without taking in its entry (one
// that is damaged or forged), so that sync does not wait for it.
func (x *agentIndex) pass(rev uint64) {
	x.mu.Lock()
	x.rev = max(x.rev, rev)
	close(x.applied)
	x.applied = make(chan struct{})
	x.mu.Unlock()
}

// progress returns the highest revision applied, and a channel closed
// when the next change is.
func (x *agentIndex) progress() (uint64, <-chan struct{}) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.rev, x.applied
}

// newlyRevoked reports whether rec revokes a key old did not.
func newlyRevoked(old, rec *AgentRecord) bool {
	if old == nil {
		return rec.Revoked() || len(rec.RevokedKeys) > 0
	}
	return rec.Revoked() && (!old.Revoked() || old.PublicKey != rec.PublicKey) || len(rec.RevokedKeys) > len(old.RevokedKeys)
}

// agentStore reads and writes the agent records.
type agentStore struct {
	kv    jetstream.KeyValue
	nc    *nats.Conn
	index *agentIndex
	seal  *recordSeal
	log   *slog.Logger

	first  jskv.Watch
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// agentsLoadTimeout bounds the wait for the agent records at start. The
// gateway serves nothing before it has them all: without its records a
// host would have no labels, and a selector such as env!=prod would pick
// it. A fleet reconnecting at once (the embedded server restarting with
// its gateway) keeps JetStream busy for a while, hence the patience.
const agentsLoadTimeout = 2 * time.Minute

// openAgentStore creates (or updates) the bucket and fills index from it,
// keeping it current until close.
func openAgentStore(nc *nats.Conn, index *agentIndex, seal *recordSeal, replicas int, admin jskv.Admin, log *slog.Logger) (*agentStore, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("agent records: %w", err)
	}
	kv, err := jskv.EnsureProtectedBucket(js, agentsLoadTimeout, jetstream.KeyValueConfig{
		Bucket:      protocol.AgentsBucket,
		Description: "fleetmcp agent records: each enrolled host's key, labels and revocation",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}, admin, log)
	if err != nil {
		return nil, err
	}
	s := &agentStore{kv: kv, nc: nc, index: index, seal: seal, log: log}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.first, err = jskv.StartWatch(s.ctx, kv, agentsLoadTimeout); err != nil {
		s.cancel()
		return nil, err
	}
	loaded := make(chan struct{})
	s.wg.Go(func() { jskv.Follow(s.ctx, s.nc, s.kv, s.first, &s.wg, s.log, loaded, s.apply) })
	select {
	case <-loaded:
	case <-time.After(agentsLoadTimeout):
		s.close()
		return nil, fmt.Errorf("agent records: bucket %s not loaded within %s", protocol.AgentsBucket, agentsLoadTimeout)
	}
	return s, nil
}

func (s *agentStore) close() {
	s.cancel()
	s.wg.Wait()
}

func (s *agentStore) apply(e jetstream.KeyValueEntry) {
	host := e.Key()
	if protocol.ValidateHost(host) != nil {
		s.log.Warn("agent records: ignoring a key that is no host name", "key", host)
		return
	}
	if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
		s.index.apply(host, e.Revision(), nil)
		return
	}
	rec, err := s.decode(host, e.Value())
	if err != nil {
		// The host keeps the record before (or none): a forged one
		// neither gives it another key nor other labels.
		s.log.Error("agent records: ignoring a record", "host", host, "revision", e.Revision(), "err", err)
		s.index.pass(e.Revision())
		return
	}
	s.index.apply(host, e.Revision(), rec)
}

func (s *agentStore) decode(host string, data []byte) (*AgentRecord, error) {
	var rec AgentRecord
	if err := s.seal.open(sealAgent, host, data, &rec); err != nil {
		return nil, err
	}
	if rec.Host != host {
		return nil, fmt.Errorf("record of host %q under key %q", rec.Host, host)
	}
	return &rec, nil
}

// get reads host's record from the bucket, with its revision.
func (s *agentStore) get(ctx context.Context, host string) (*AgentRecord, uint64, error) {
	e, err := jskv.Retry(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return s.kv.Get(ctx, host) })
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w %q: no host of that name was enrolled", ErrUnknownAgent, host)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read the record of %s: %w", host, err)
	}
	rec, err := s.decode(host, e.Value())
	if err != nil {
		return nil, 0, fmt.Errorf("the record of %s is damaged or forged: %w", host, err)
	}
	if held, ok := s.index.record(host); ok && held.Gen > rec.Gen {
		// An old copy was put back: the next write starts from the
		// record held, and so puts it back in the bucket.
		s.log.Warn("agent records: the stored record is an old copy; writing over it from the one held", "host", host,
			"stored_gen", rec.Gen, "held_gen", held.Gen)
		c := held.clone()
		return &c, e.Revision(), nil
	}
	return rec, e.Revision(), nil
}

// create stores a new record; errRecordChanged if host has one already.
func (s *agentStore) create(ctx context.Context, rec *AgentRecord) (uint64, error) {
	rec.Gen = 1
	data, err := s.seal.seal(sealAgent, rec.Host, rec)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	rev, err := s.kv.Create(ctx, rec.Host, data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, fmt.Errorf("create the record of %s: %w", rec.Host, errRecordChanged)
	}
	if err != nil {
		return 0, fmt.Errorf("create the record of %s: %w", rec.Host, err)
	}
	held := rec.clone()
	s.index.wrote(&held, rev)
	return rev, nil
}

// update replaces the record read at rev; errRecordChanged if it changed
// since.
func (s *agentStore) update(ctx context.Context, rec *AgentRecord, rev uint64) (uint64, error) {
	rec.Gen++
	data, err := s.seal.seal(sealAgent, rec.Host, rec)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	next, err := s.kv.Update(ctx, rec.Host, data, rev)
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("update the record of %s: %w", rec.Host, errRecordChanged)
	}
	if err != nil {
		return 0, fmt.Errorf("update the record of %s: %w", rec.Host, err)
	}
	held := rec.clone()
	s.index.wrote(&held, next)
	return next, nil
}

// putOver stores rec over whatever the bucket holds for its host (a
// record that cannot be read: forged, damaged, removed). Its Gen is set
// above the bucket's last revision, which no record's Gen can pass (each
// write of any record adds one revision), so every gateway takes it in
// over the record it holds.
func (s *agentStore) putOver(ctx context.Context, rec *AgentRecord) error {
	st, err := jskv.Retry(ctx, s.kv.Status)
	if err != nil {
		return fmt.Errorf("write the record of %s: %w", rec.Host, err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return errors.New("agent records: unexpected bucket status")
	}
	rec.Gen = max(rec.Gen, bs.StreamInfo().State.LastSeq) + 1
	data, err := s.seal.seal(sealAgent, rec.Host, rec)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	rev, err := s.kv.Put(pctx, rec.Host, data)
	if err != nil {
		return fmt.Errorf("write the record of %s: %w", rec.Host, err)
	}
	held := rec.clone()
	s.index.wrote(&held, rev)
	return nil
}

// modify applies change to host's record with compare-and-swap, reading
// it again as often as another writer came first. change returns
// jskv.ErrSkip when there is nothing to write.
func (s *agentStore) modify(ctx context.Context, host string, change func(*AgentRecord) error) (*AgentRecord, error) {
	return jskv.ModifyCAS(ctx, func() (*AgentRecord, uint64, error) { return s.get(ctx, host) },
		func(rec *AgentRecord, rev uint64) error { _, err := s.update(ctx, rec, rev); return err },
		errRecordChanged, change)
}

// sync waits until the index holds every record written before it was
// called (by any gateway), so that a decision made from the index sees
// them.
func (s *agentStore) sync(ctx context.Context) error {
	st, err := jskv.Retry(ctx, s.kv.Status)
	if err != nil {
		return fmt.Errorf("agent records: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return errors.New("agent records: unexpected bucket status")
	}
	last := bs.StreamInfo().State.LastSeq
	// A caller with a deadline of its own waits as long as it allows: a
	// watch re-made after a node's loss may take longer than the bound.
	wait := storeLoadTimeout
	if d, ok := ctx.Deadline(); ok {
		wait = max(wait, time.Until(d))
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		rev, next := s.index.progress()
		if rev >= last {
			return nil
		}
		select {
		case <-next:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("agent records: the watch did not reach revision %d within %s", last, wait.Round(time.Second))
		}
	}
}

// RevokedKeys implements natsauth.KeySource.
func (s *agentStore) RevokedKeys(ctx context.Context) ([]natsauth.RevokedKey, error) {
	if err := s.sync(ctx); err != nil {
		return nil, err
	}
	s.index.mu.RLock()
	defer s.index.mu.RUnlock()
	var out []natsauth.RevokedKey
	for _, r := range s.index.byHost {
		out = append(out, r.revokedKeys()...)
	}
	return out, nil
}
