package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file shares the host registry between gateway replicas through a
// JetStream key-value bucket (protocol.HostsBucket, history 1, key = host
// ID). Each record is a host's last announce (without the fields that
// change on every heartbeat) and when it was last seen:
//
//	{"announce": {...}, "last_seen": "2025-03-04T05:06:07Z"}
//
// Every replica hears every heartbeat itself, so the bucket is not on the
// heartbeat path: a replica writes a host's record only
//
//   - when the facts it heard differ from the record (a new host, changed
//     labels, skills, tools, policy, agent version, a restarted agent);
//   - when a host it heard went offline and the record's last-seen is more
//     than seenSlack older than what it heard;
//   - when the record of a host it hears online is older than seenRefresh
//     (plus up to a quarter more, spread by host name), so last-seen stays
//     roughly right even for hosts that die while no gateway runs.
//
// At steady state — hosts online, nothing changing — that is no writes at
// all but the hourly refresh: 10,000 hosts cost about 3 writes a second.
// Replicas write with the revision they last saw (create for a new key),
// so of two replicas that heard the same change one write wins and the
// other, refused, waits for the watch to bring the winner's record, which
// then matches what it heard. While two agents claim one host name its
// record is left alone.
//
// Each replica watches the bucket: at start it loads every record, so it
// knows hosts that went offline before it started, with their labels;
// afterwards the watch tells it the facts of hosts it has not heard itself.
// Records never decide whether a host is online (see registry.go).
//
// Hosts offline for longer than HostsConfig.Retention are removed from
// the bucket (with the revision checked, so a host that came back is not
// removed) and from every replica's registry.

// HostsConfig configures the hosts bucket.
type HostsConfig struct {
	// Retention is how long a host may stay offline before it is
	// forgotten. Default 30 days; negative: never.
	Retention time.Duration
	// Replicas is the replica count of the hosts bucket and of the
	// other buckets the replicas share (agents, join tokens, nonces,
	// skills). Default (0): 3 on a NATS cluster, else 1.
	Replicas int
	// MaxBytes bounds the memory the registry's hosts may take (about 2.5
	// KB per typical host; an agent can make its host take at most about
	// protocol.MaxAnnounceBytes). An announce that would take the registry
	// beyond it is ignored, and logged. Default 512 MiB; at least 1 MiB.
	MaxBytes int64
}

func (c *HostsConfig) setDefaults() {
	setDur(&c.Retention, 30*24*time.Hour)
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultHostsMaxBytes
	}
}

func (c *HostsConfig) validate() []error {
	var errs []error
	if c.Replicas < 0 || c.Replicas > 5 {
		errs = append(errs, fmt.Errorf("hosts bucket replicas %d: use 1 to 5 (3 on a 3-node cluster), or 0 for the default (3 on a cluster, else 1)", c.Replicas))
	}
	if c.MaxBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("host registry bound %d bytes is too small (minimum 1 MiB)", c.MaxBytes))
	}
	if c.Retention > 0 && c.Retention < time.Hour {
		errs = append(errs, fmt.Errorf("hosts retention %s is too short (minimum 1h; negative keeps hosts forever)", c.Retention))
	}
	return errs
}

const (
	// storeSweep is how often the store looks for hosts gone offline,
	// records due for a refresh and hosts to forget.
	storeSweep = 5 * time.Second
	// storeSettle is the pause after each pass, so that a burst of
	// changes (a skill rolled out to the fleet) is written in few passes.
	storeSettle = 200 * time.Millisecond
	// seenSlack is how far a record's last-seen may lag what a gateway
	// heard before the record is rewritten for it.
	seenSlack = time.Minute
	// seenRefresh is how old the record of an online host may grow.
	seenRefresh = time.Hour
	// holdAfterFailure pauses the writes of a host whose write was refused
	// or failed.
	holdAfterFailure = 30 * time.Second
	// storeLoadTimeout bounds the wait for the bucket's records at start.
	storeLoadTimeout = 10 * time.Second
)

// hostRecord is a record of the hosts bucket.
type hostRecord struct {
	Announce *protocol.Announce `json:"announce"`
	LastSeen time.Time          `json:"last_seen"`
}

// hostStore keeps the registry and the hosts bucket in step: one goroutine
// applies the bucket's changes to the registry, another writes what this
// gateway heard.
type hostStore struct {
	kv        jetstream.KeyValue
	reg       *registry
	log       *slog.Logger
	retention time.Duration

	nc     *nats.Conn
	first  jskv.Watch      // the watch started at open; then owned by watch
	loaded chan struct{}   // closed once the bucket's records are in the registry
	ctx    context.Context // ends at close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	flushMu sync.Mutex // one pass at a time
	failing bool       // guarded by flushMu: the last write failed

	// writes counts records written and removed by this gateway; races
	// writes refused because another gateway wrote first.
	writes, races atomic.Int64
}

// openHostStore creates (or updates) the hosts bucket, loads its records
// into reg, and keeps both in step until close.
func openHostStore(nc *nats.Conn, reg *registry, cfg HostsConfig, log *slog.Logger) (*hostStore, error) {
	s, err := newHostStore(nc, reg, cfg, log)
	if err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go s.run()
	return s, nil
}

// newHostStore is openHostStore without the writer: records reach the
// registry, and only flush writes.
func newHostStore(nc *nats.Conn, reg *registry, cfg HostsConfig, log *slog.Logger) (*hostStore, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("hosts bucket: %w", err)
	}
	kv, err := ensureHostsBucket(js, cfg)
	if err != nil {
		return nil, err
	}
	s := &hostStore{kv: kv, nc: nc, reg: reg, log: log, retention: cfg.Retention}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.first, err = jskv.StartWatch(s.ctx, kv, jskv.WatchPatience); err != nil {
		s.cancel()
		return nil, err
	}
	s.loaded = make(chan struct{})
	s.wg.Add(1)
	go s.watch(s.loaded)
	select {
	case <-s.loaded:
	case <-time.After(storeLoadTimeout):
		log.Warn("hosts bucket not loaded yet; hosts that are offline may show up late", "waited", storeLoadTimeout)
	}
	return s, nil
}

// isLoaded reports whether the bucket's records are in the registry.
func (s *hostStore) isLoaded() bool {
	select {
	case <-s.loaded:
		return true
	default:
		return false
	}
}

// ensureHostsBucket creates or updates the bucket, retrying while
// JetStream starts up.
func ensureHostsBucket(js jetstream.JetStream, cfg HostsConfig) (jetstream.KeyValue, error) {
	return jskv.EnsureBucket(js, jskv.WatchPatience, jetstream.KeyValueConfig{
		Bucket:      protocol.HostsBucket,
		Description: "fleetmcp host registry: each host's last announce and when it was last seen",
		History:     1,
		// No gateway writes a larger record; none is stored.
		MaxValueSize: maxRecordBytes,
		Storage:      jetstream.FileStorage,
		Replicas:     cfg.Replicas,
	})
}

// close stops watching and writing. Records not yet written are left to
// the next gateway that hears their hosts.
func (s *hostStore) close() {
	s.cancel()
	s.wg.Wait()
}

// watch applies the bucket's records to the registry: the current ones
// first (then loaded is closed), then every change (see jskv.Follow).
func (s *hostStore) watch(loaded chan struct{}) {
	defer s.wg.Done()
	jskv.Follow(s.ctx, s.nc, s.kv, s.first, &s.wg, s.log, loaded, s.apply)
}

func (s *hostStore) apply(e jetstream.KeyValueEntry) {
	host := e.Key()
	if err := protocol.ValidateHost(host); err != nil {
		s.log.Warn("ignoring a hosts bucket key that is no host name", "key", host, "err", err)
		return
	}
	if s.reg.revision(host) >= e.Revision() {
		return // seen before (a new watch delivers every record again)
	}
	if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
		s.reg.applyDeleted(host, e.Revision())
		return
	}
	rec, err := decodeRecord(host, e.Value())
	if err != nil {
		// Noted with an empty digest, so a gateway that hears the host
		// writes a good record over it.
		s.reg.rejects.Log(s.log, slog.LevelWarn, "bucket/"+host, "ignoring a damaged hosts bucket record", "host", host, "revision", e.Revision(), "err", err.Error())
		_ = s.reg.applyRecord(host, e.Revision(), nil, factsDigest{}, time.Time{})
		return
	}
	rec.Announce.Busy, rec.Announce.Leaving, rec.Announce.Labels = 0, false, nil
	if err := s.reg.applyRecord(host, e.Revision(), rec.Announce, digestOf(rec.Announce), rec.LastSeen); err != nil {
		s.reg.rejects.Log(s.log, slog.LevelWarn, "bucket/"+host, "ignoring a hosts bucket record", "host", host, "revision", e.Revision(), "err", err.Error())
	}
}

// maxRecordBytes bounds a record of the hosts bucket: an announce within
// its limit and the record's own fields.
const maxRecordBytes = protocol.MaxAnnounceBytes + 1<<10

// decodeRecord parses and checks a record of the hosts bucket, as the
// announce it holds was checked when it was heard: a record written by
// another gateway (of another version, or one that was tampered with)
// must not make this one hold more than an agent could.
func decodeRecord(host string, data []byte) (*hostRecord, error) {
	if len(data) > maxRecordBytes {
		return nil, fmt.Errorf("record is %d bytes; at most %d are allowed", len(data), maxRecordBytes)
	}
	var rec hostRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("record is not valid JSON: %s", protocol.Clip(err.Error(), 200))
	}
	if rec.Announce == nil || rec.Announce.Host != host {
		return nil, errors.New("no announce of this host in it")
	}
	if err := rec.Announce.Validate(); err != nil {
		return nil, err
	}
	return &rec, nil
}

// run writes what is due whenever the registry reports a change, and
// every storeSweep.
func (s *hostStore) run() {
	defer s.wg.Done()
	tick := time.NewTicker(storeSweep)
	defer tick.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.reg.changed:
		case <-tick.C:
		}
		s.reg.logOffline(s.reg.now())
		s.flush()
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(storeSettle):
		}
	}
}

// flush writes the records that are due and removes the hosts to forget.
// After three failures in a row (NATS is probably unreachable) it leaves
// the rest to the next pass.
func (s *hostStore) flush() {
	ctx := s.ctx
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	writes, forget := s.reg.due(s.reg.now(), s.retention)
	failures := 0
	for _, w := range writes {
		if failures >= 3 || ctx.Err() != nil {
			return
		}
		if err := s.write(ctx, w); err != nil {
			failures++
			s.failed(w.host, "write", err)
			continue
		}
		failures = 0
	}
	for _, f := range forget {
		if failures >= 3 || ctx.Err() != nil {
			return
		}
		if err := s.forget(ctx, f); err != nil {
			failures++
			s.failed(f.host, "remove", err)
			continue
		}
		failures = 0
	}
}

// write stores one host's record: created when the bucket has none,
// updated only over the revision this gateway last saw. A write refused
// because another gateway wrote first is no error.
func (s *hostStore) write(ctx context.Context, w hostWrite) error {
	data, err := json.Marshal(hostRecord{Announce: w.facts, LastSeen: w.seen.UTC()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	var rev uint64
	if w.rev == 0 {
		rev, err = s.kv.Create(ctx, w.host, data)
	} else {
		rev, err = s.kv.Update(ctx, w.host, data, w.rev)
	}
	switch {
	case err == nil:
		s.writes.Add(1)
		s.reg.noteWritten(w.host, rev, w.digest, w.seen)
		s.recovered()
		return nil
	case errors.Is(err, jetstream.ErrKeyExists), errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		s.races.Add(1)
		s.reg.hold(w.host, s.reg.now().Add(holdAfterFailure))
		return nil
	}
	return err
}

// forget removes the record of a host gone for longer than the
// retention, unless it changed since this gateway decided so.
func (s *hostStore) forget(ctx context.Context, f hostWrite) error {
	ctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	err := s.kv.Delete(ctx, f.host, jetstream.LastRevision(f.rev))
	switch {
	case err == nil:
		s.writes.Add(1)
		s.reg.forgotten(f.host, f.rev)
		s.log.Info("forgot a host offline for longer than the retention", "host", f.host, "retention", s.retention)
		s.recovered()
		return nil
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		s.races.Add(1)
		return nil
	}
	return err
}

// failed holds a host whose write failed and logs the first failure of a
// run of them.
func (s *hostStore) failed(host, what string, err error) {
	s.reg.hold(host, s.reg.now().Add(holdAfterFailure))
	level := slog.LevelDebug
	if !s.failing {
		level = slog.LevelWarn
	}
	s.failing = true
	s.log.Log(context.Background(), level, "hosts bucket: "+what+" failed; retrying later", "host", host, "err", err)
}

func (s *hostStore) recovered() {
	if s.failing {
		s.failing = false
		s.log.Info("hosts bucket writable again")
	}
}

// hostWrite is a record due in the bucket, or (facts nil) a host to
// forget at revision rev.
type hostWrite struct {
	host   string
	rev    uint64
	facts  *protocol.Announce
	digest factsDigest
	seen   time.Time
}

// refreshAfter is how old host's record may grow while it is online:
// seenRefresh plus up to a quarter more, fixed per host, so that records
// written together are not all refreshed together.
func refreshAfter(host string) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(host))
	return seenRefresh + time.Duration(h.Sum64()%uint64(seenRefresh/4))
}

// due returns the records this gateway should write now, and the hosts to
// forget (offline for longer than retention; never when retention ≤ 0). A
// host never written to the bucket is forgotten here and now.
func (r *registry) due(now time.Time, retention time.Duration) (writes, forget []hostWrite) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for host, e := range r.hosts {
		live := r.liveCount(e, now)
		if now.Before(e.holdUntil) {
			continue
		}
		// Only what this gateway heard is written, and not while two
		// agents claim the name.
		if !e.heard.IsZero() && live <= 1 {
			var need bool
			switch {
			case e.digest != e.kvDigest:
				need = true
			case live == 1:
				need = now.Sub(e.kvSeen) > refreshAfter(host)
			default:
				need = e.heard.Sub(e.kvSeen) > seenSlack
			}
			if need {
				writes = append(writes, hostWrite{host: host, rev: e.rev, facts: e.facts, digest: e.digest, seen: e.heard})
				continue
			}
		}
		if retention > 0 && live == 0 && e.facts != nil && now.Sub(e.lastSeen()) > retention {
			if e.rev == 0 {
				r.removeEntry(host, e)
				continue
			}
			forget = append(forget, hostWrite{host: host, rev: e.rev})
		}
	}
	return writes, forget
}

// noteWritten records that this gateway wrote host's record at rev.
func (r *registry) noteWritten(host string, rev uint64, digest factsDigest, seen time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.hosts[host]; e != nil && rev > e.rev {
		e.rev, e.kvDigest, e.kvSeen, e.holdUntil = rev, digest, seen, time.Time{}
	}
}

// revision returns the revision of host's record this gateway has seen
// (0: none, or the host is unknown).
func (r *registry) revision(host string) uint64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if e := r.hosts[host]; e != nil {
		return e.rev
	}
	return 0
}

// hold pauses writes of host until until.
func (r *registry) hold(host string, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.hosts[host]; e != nil {
		e.holdUntil = until
	}
}

// applyRecord takes in a record the watch reported (facts nil: a record
// this gateway cannot read, damaged or written in a newer format; such an
// entry is not listed, and is overwritten only by a gateway that hears its
// host). A host this gateway hears online keeps the facts it heard; for
// any other host the record's facts are adopted, unless this gateway heard
// the host after the record's last-seen.
func (r *registry) applyRecord(host string, rev uint64, facts *protocol.Announce, digest factsDigest, seen time.Time) error {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.hosts[host]
	if e == nil {
		// Even for a damaged record, so that a write over it has its
		// revision.
		e = r.addEntry(host)
	}
	if rev <= e.rev {
		return nil
	}
	e.rev, e.kvDigest, e.kvSeen, e.holdUntil = rev, digest, seen, time.Time{}
	if facts != nil && digest != e.digest && (e.facts == nil || r.liveCount(e, now) == 0 && !seen.Before(e.heard)) {
		return r.setFacts(host, e, facts, digest)
	}
	return nil
}

// applyDeleted takes in a removed record: the host is forgotten unless
// this gateway hears it online, in which case it writes the record again.
func (r *registry) applyDeleted(host string, rev uint64) {
	now := r.now()
	r.mu.Lock()
	e := r.hosts[host]
	if e == nil || rev <= e.rev {
		r.mu.Unlock()
		return
	}
	online := r.liveCount(e, now) > 0
	if online {
		e.rev, e.kvDigest, e.kvSeen, e.holdUntil = rev, factsDigest{}, time.Time{}, time.Time{}
	} else {
		r.removeEntry(host, e)
	}
	r.mu.Unlock()
	if online {
		r.notify()
	}
}

// forgotten drops host after this gateway removed its record at rev,
// unless it came back meanwhile.
func (r *registry) forgotten(host string, rev uint64) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if e := r.hosts[host]; e != nil && e.rev == rev && r.liveCount(e, now) == 0 {
		r.removeEntry(host, e)
	}
}
