package enrol

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
	// identity (the gateway's connection watch). Calls to the host are refused, by every
	// gateway and across restarts, while the record still has the key it
	// names and is not revoked: revoking the host or re-enrolling it
	// with --replace (another key) ends it.
	IdentityConflict *RecordedConflict `json:"identity_conflict,omitempty"`
	// Gen counts the record's writes (1 when created). Records are
	// sealed (seal.go), but an old sealed copy put back into the
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

// ConflictStands returns the record's identity conflict while it stands:
// it names the key the record holds, and the host is not revoked.
func (r *AgentRecord) ConflictStands() (*RecordedConflict, bool) {
	ic := r.IdentityConflict
	if ic == nil || r.Revoked() || ic.PublicKey != r.PublicKey {
		return nil, false
	}
	return ic, true
}

// Revoked reports whether the host was revoked.
func (r *AgentRecord) Revoked() bool { return !r.RevokedAt.IsZero() }

// RevokesKey reports whether r names pub among its revoked keys.
func (r *AgentRecord) RevokesKey(pub string) bool {
	return slices.ContainsFunc(r.RevokedKeys, func(k RevokedKey) bool { return k.PublicKey == pub }) || r.Revoked() && r.PublicKey == pub
}

// Clone returns a copy of r that shares no maps or slices with it.
func (r *AgentRecord) Clone() AgentRecord {
	c := *r
	c.Labels = maps.Clone(r.Labels)
	c.RevokedKeys = slices.Clone(r.RevokedKeys)
	if r.IdentityConflict != nil {
		ic := *r.IdentityConflict
		c.IdentityConflict = &ic
	}
	return c
}

// A Revocation is a key the records say is revoked, and until when a
// credential issued for it may be valid.
type Revocation struct {
	Key       string
	RevokedAt time.Time
	Expires   time.Time
	// Exact: Expires is when the last credential of the key expires (an
	// enrol credential), not only the record's latest agent credential.
	Exact bool
}

// Revocations lists the record's revoked keys: its earlier keys, and its
// current one when the host is revoked.
func (r *AgentRecord) Revocations() []Revocation {
	var out []Revocation
	for _, k := range r.RevokedKeys {
		out = append(out, Revocation{Key: k.PublicKey, RevokedAt: k.RevokedAt, Expires: k.CredentialExpiresAt})
	}
	if r.Revoked() {
		out = append(out, Revocation{Key: r.PublicKey, RevokedAt: r.RevokedAt, Expires: r.CredentialExpiresAt})
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

// Index is the gateway's copy of the agent records, kept by the
// bucket's watch.
type Index struct {
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

// NewIndex returns an empty index.
func NewIndex() *Index {
	return &Index{byHost: make(map[string]*AgentRecord), byKey: make(map[string]string), applied: make(chan struct{}, 1)}
}

// OnRevoked sets the function told about every host whose record turns
// revoked or gets a newly revoked key; call it before the index is
// filled.
func (x *Index) OnRevoked(f func(host string)) {
	x.mu.Lock()
	x.revoked = f
	x.mu.Unlock()
}

// Record returns host's record; the caller must not modify it.
func (x *Index) Record(host string) (*AgentRecord, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r, ok := x.byHost[host]
	return r, ok
}

// KeyHost returns the host a key was enrolled for.
func (x *Index) KeyHost(pub string) (string, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	h, ok := x.byKey[pub]
	return h, ok
}

// KeysOf returns every key ever enrolled for host as far as the index
// knows, even when its record was removed since.
func (x *Index) KeysOf(host string) []string {
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

// All returns every record, sorted by host.
func (x *Index) All() []AgentRecord {
	x.mu.RLock()
	out := make([]AgentRecord, 0, len(x.byHost))
	for _, r := range x.byHost {
		out = append(out, r.Clone())
	}
	x.mu.RUnlock()
	slices.SortFunc(out, func(a, b AgentRecord) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// Apply takes in one entry of the bucket (rec nil: the record was
// removed).
func (x *Index) Apply(host string, rev uint64, rec *AgentRecord) {
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
func (x *Index) wrote(rec *AgentRecord, rev uint64) {
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
func (x *Index) pass(rev uint64) {
	x.mu.Lock()
	x.rev = max(x.rev, rev)
	close(x.applied)
	x.applied = make(chan struct{})
	x.mu.Unlock()
}

// Progress returns the highest revision applied, and a channel closed
// when the next change is.
func (x *Index) Progress() (uint64, <-chan struct{}) {
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

// Agents reads and writes the agent records.
type Agents struct {
	kv    jetstream.KeyValue
	nc    *nats.Conn
	index *Index
	seal  *Seal
	log   *slog.Logger

	first  jskv.Watch
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// LoadTimeout bounds the wait for the agent records at start. The
// gateway serves nothing before it has them all: without its records a
// host would have no labels, and a selector such as env!=prod would pick
// it. A fleet reconnecting at once (the embedded server restarting with
// its gateway) keeps JetStream busy for a while, hence the patience.
const LoadTimeout = 2 * time.Minute

// syncTimeout is how long Sync waits for the watch at least.
const syncTimeout = 10 * time.Second

// OpenAgents creates (or updates) the bucket and fills index from it,
// keeping it current until Close. admin, when not nil, acts on the
// bucket's stream with the rights the gateway's own user lacks.
func OpenAgents(nc *nats.Conn, index *Index, seal *Seal, replicas int, admin jskv.Admin, log *slog.Logger) (*Agents, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("agent records: %w", err)
	}
	kv, err := jskv.EnsureProtectedBucket(js, LoadTimeout, jetstream.KeyValueConfig{
		Bucket:      protocol.AgentsBucket,
		Description: "fleetmcp agent records: each enrolled host's key, labels and revocation",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}, admin, log)
	if err != nil {
		return nil, err
	}
	s := &Agents{kv: kv, nc: nc, index: index, seal: seal, log: log}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.first, err = jskv.StartWatch(s.ctx, kv, LoadTimeout); err != nil {
		s.cancel()
		return nil, err
	}
	loaded := make(chan struct{})
	s.wg.Go(func() { jskv.Follow(s.ctx, s.nc, s.kv, s.first, &s.wg, s.log, loaded, s.apply) })
	select {
	case <-loaded:
	case <-time.After(LoadTimeout):
		s.Close()
		return nil, fmt.Errorf("agent records: bucket %s not loaded within %s", protocol.AgentsBucket, LoadTimeout)
	}
	return s, nil
}

// Close stops following the bucket.
func (s *Agents) Close() {
	s.cancel()
	s.wg.Wait()
}

func (s *Agents) apply(e jetstream.KeyValueEntry) {
	host := e.Key()
	if protocol.ValidateHost(host) != nil {
		s.log.Warn("agent records: ignoring a key that is no host name", "key", host)
		return
	}
	if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
		s.index.Apply(host, e.Revision(), nil)
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
	s.index.Apply(host, e.Revision(), rec)
}

func (s *Agents) decode(host string, data []byte) (*AgentRecord, error) {
	var rec AgentRecord
	if err := s.seal.Open(sealAgent, host, data, &rec); err != nil {
		return nil, err
	}
	if rec.Host != host {
		return nil, fmt.Errorf("record of host %q under key %q", rec.Host, host)
	}
	return &rec, nil
}

// Get reads host's record from the bucket, with its revision.
func (s *Agents) Get(ctx context.Context, host string) (*AgentRecord, uint64, error) {
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
	if held, ok := s.index.Record(host); ok && held.Gen > rec.Gen {
		// An old copy was put back: the next write starts from the
		// record held, and so puts it back in the bucket.
		s.log.Warn("agent records: the stored record is an old copy; writing over it from the one held", "host", host,
			"stored_gen", rec.Gen, "held_gen", held.Gen)
		c := held.Clone()
		return &c, e.Revision(), nil
	}
	return rec, e.Revision(), nil
}

// create stores a new record; errRecordChanged if host has one already.
func (s *Agents) create(ctx context.Context, rec *AgentRecord) (uint64, error) {
	rec.Gen = 1
	data, err := s.seal.Seal(sealAgent, rec.Host, rec)
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
	held := rec.Clone()
	s.index.wrote(&held, rev)
	return rev, nil
}

// update replaces the record read at rev; errRecordChanged if it changed
// since.
func (s *Agents) update(ctx context.Context, rec *AgentRecord, rev uint64) (uint64, error) {
	rec.Gen++
	data, err := s.seal.Seal(sealAgent, rec.Host, rec)
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
	held := rec.Clone()
	s.index.wrote(&held, next)
	return next, nil
}

// putOver stores rec over whatever the bucket holds for its host (a
// record that cannot be read: forged, damaged, removed). Its Gen is set
// above the bucket's last revision, which no record's Gen can pass (each
// write of any record adds one revision), so every gateway takes it in
// over the record it holds.
func (s *Agents) putOver(ctx context.Context, rec *AgentRecord) error {
	st, err := jskv.Retry(ctx, s.kv.Status)
	if err != nil {
		return fmt.Errorf("write the record of %s: %w", rec.Host, err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return errors.New("agent records: unexpected bucket status")
	}
	rec.Gen = max(rec.Gen, bs.StreamInfo().State.LastSeq) + 1
	data, err := s.seal.Seal(sealAgent, rec.Host, rec)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	rev, err := s.kv.Put(pctx, rec.Host, data)
	if err != nil {
		return fmt.Errorf("write the record of %s: %w", rec.Host, err)
	}
	held := rec.Clone()
	s.index.wrote(&held, rev)
	return nil
}

// Modify applies change to host's record with compare-and-swap, reading
// it again as often as another writer came first. change returns
// jskv.ErrSkip when there is nothing to write.
func (s *Agents) Modify(ctx context.Context, host string, change func(*AgentRecord) error) (*AgentRecord, error) {
	return jskv.ModifyCAS(ctx, func() (*AgentRecord, uint64, error) { return s.Get(ctx, host) },
		func(rec *AgentRecord, rev uint64) error { _, err := s.update(ctx, rec, rev); return err },
		errRecordChanged, change)
}

// sync waits until the index holds every record written before it was
// called (by any gateway), so that a decision made from the index sees
// them.
func (s *Agents) sync(ctx context.Context) error {
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
	wait := syncTimeout
	if d, ok := ctx.Deadline(); ok {
		wait = max(wait, time.Until(d))
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		rev, next := s.index.Progress()
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

// Revocations returns every key the records say is revoked, once the
// index holds every record written before the call.
func (s *Agents) Revocations(ctx context.Context) ([]Revocation, error) {
	if err := s.sync(ctx); err != nil {
		return nil, err
	}
	s.index.mu.RLock()
	defer s.index.mu.RUnlock()
	var out []Revocation
	for _, r := range s.index.byHost {
		out = append(out, r.Revocations()...)
	}
	return out, nil
}
