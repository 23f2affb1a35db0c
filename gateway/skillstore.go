package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/policy"
	"github.com/fleetmcp/fleetmcp/protocol"
	"github.com/fleetmcp/fleetmcp/protocol/skillmd"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file is the skill store of fleet-wide rollout. Files live in the
// object store skillFilesBucket under their hex SHA-256, once for every
// version that has them; each pushed bundle's signed manifest lives in
// the KV bucket skillBundlesBucket under its bundle ID. A push stores the
// files first and the manifest last, so no manifest ever names a missing
// file, and the same bundle pushed twice is one version. Every gateway
// follows the manifests and the rollouts with one watch each, and the
// hosts' status reports with one ordered consumer (skilldesired.go): what
// a gateway holds of skills does not depend on how many hosts there are.

// Buckets of the skill store (besides protocol.SkillsDesiredBucket).
const (
	skillFilesBucket   = "fleet_skill_files"
	skillBundlesBucket = "fleet_skill_bundles"
	rolloutsBucket     = "fleet_rollouts"
	leaderBucket       = "fleet_skills_leader"
)

// Errors of the skill operations; the messages they wrap say what to do.
var (
	// ErrSkillRefused: the bundle breaks a rule; nothing was stored.
	ErrSkillRefused = errors.New("skill bundle refused")
	// ErrSkillNotFound: no such skill, bundle or rollout.
	ErrSkillNotFound = errors.New("not found")
	// ErrSkillsOff: the gateway has no signing key.
	ErrSkillsOff = errors.New("skill rollout is off: the gateway has no signing key (set --signing_key or --data_dir)")
	// ErrRolloutState: the action does not apply to the rollout's state.
	ErrRolloutState = errors.New("rollout state")
)

// fleetMember is a host a rollout may select: enrolled, not revoked.
type fleetMember struct {
	Host   string
	Labels map[string]string
	Online bool
}

// fleetView is what the skill service needs of the fleet.
type fleetView interface {
	// members returns every enrolled host that is not revoked, sorted.
	members() []fleetMember
	// online reports whether host's agent is connected now.
	online(host string) bool
	// agentOK says why host may not fetch skills (unknown, revoked), or
	// nil.
	agentOK(host string) error
}

// skillOptions tune the skill service; tests shorten the times.
type skillOptions struct {
	replicas int
	// leaderTTL is the leader key's bucket TTL: a dead leader is replaced
	// within it.
	leaderTTL time.Duration
	// tick is how often the leader looks at its rollouts when nothing
	// happens.
	tick time.Duration
	// cacheBytes bounds the file cache.
	cacheBytes int64
	// id names this replica in the leader key.
	id string
	// poke tells host to read its desired state now (a signed message:
	// Gateway.pokeHost); required.
	poke func(host string)
	// audit, when set, stores an audit record (a host reporting a
	// tampered skill: skilltamper.go).
	audit func(*audit.Record)
}

// skillService is one gateway's part of skill rollout.
type skillService struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	files   jetstream.ObjectStore
	bundles jetstream.KeyValue
	desired jetstream.KeyValue
	rolls   jetstream.KeyValue
	leader  jetstream.KeyValue
	signer  *signingKey
	fleet   fleetView
	log     *slog.Logger
	opts    skillOptions
	now     func() time.Time

	cache  *blobCache
	status *statusView
	ctl    *controller

	mu       sync.RWMutex
	manifest map[string]*bundleRecord // by bundle ID hex
	rollouts map[string]rolloutEntry  // by rollout ID

	subs   []*nats.Subscription
	work   chan *nats.Msg
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// bundleRecord is a pushed bundle as skillBundlesBucket keeps it.
type bundleRecord struct {
	protocol.SignedManifest
	PushedAt time.Time `json:"pushed_at"`
	PushedBy string    `json:"pushed_by,omitempty"`
	// Description is the SKILL.md's, for lists.
	Description string `json:"description,omitempty"`
}

// rolloutEntry is a rollout as the watch last delivered it.
type rolloutEntry struct {
	r   *rollout
	rev uint64
}

// openSkillService creates the buckets and the stream, loads the
// manifests and rollouts, and starts serving agents and (when elected)
// driving rollouts.
func openSkillService(nc *nats.Conn, signer *signingKey, fleet fleetView, opts skillOptions, log *slog.Logger) (*skillService, error) {
	if opts.poke == nil {
		return nil, errors.New("skills: no way to poke hosts")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("skills: %w", err)
	}
	s := &skillService{nc: nc, js: js, signer: signer, fleet: fleet, log: log, opts: opts, now: time.Now,
		cache: newBlobCache(opts.cacheBytes), manifest: map[string]*bundleRecord{}, rollouts: map[string]rolloutEntry{},
		work: make(chan *nats.Msg, 4096)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if err := s.openBuckets(); err != nil {
		s.cancel()
		return nil, err
	}
	if err := s.follow(s.bundles, s.applyBundle); err != nil {
		s.close()
		return nil, err
	}
	if err := s.follow(s.rolls, s.applyRollout); err != nil {
		s.close()
		return nil, err
	}
	// The controller exists before the status view, whose reports ask
	// it whether this replica leads; it runs once everything is open.
	s.ctl = newController(s)
	tamper := &tamperAuditor{write: opts.audit, leader: s.ctl.leader, known: s.rolledOutTo, log: log, now: s.now}
	if s.status, err = openStatusView(s.ctx, js, opts.replicas, log, tamper.report); err != nil {
		s.close()
		return nil, err
	}
	if err := s.serve(); err != nil {
		s.close()
		return nil, err
	}
	s.wg.Go(func() { s.ctl.run(s.ctx) })
	return s, nil
}

// rolledOutTo reports whether a rollout of skill name includes host.
func (s *skillService) rolledOutTo(host, name string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, e := range s.rollouts {
		if e.r.Skill == name && slices.Contains(e.r.Hosts, host) {
			return true
		}
	}
	return false
}

// leaderStorage is where the leader lease lives: in memory on one
// server; on a cluster in files, because a replicated memory stream does
// not come back when a quorum of its servers restarts (they restart
// without its state), and the rollout controller would never find its
// lease again.
func leaderStorage(replicas int) jetstream.StorageType {
	if replicas > 1 {
		return jetstream.FileStorage
	}
	return jetstream.MemoryStorage
}

// dropMemoryLeader deletes a leader bucket kept in memory when kc keeps
// it in files (a gateway of an older version made it so): JetStream does
// not change a stream's storage, and the lease it holds is only a lease
// (the controllers take it again within its TTL).
func (s *skillService) dropMemoryLeader(kc jetstream.KeyValueConfig) {
	if kc.Storage != jetstream.FileStorage {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, jskv.Timeout)
	defer cancel()
	info, err := s.js.Stream(ctx, "KV_"+kc.Bucket)
	if err != nil || info.CachedInfo().Config.Storage == jetstream.FileStorage {
		return
	}
	if err := s.js.DeleteKeyValue(ctx, kc.Bucket); err != nil {
		s.log.Warn("skills: the rollout leader bucket is kept in memory and could not be moved to files", "err", err)
		return
	}
	s.log.Info("skills: the rollout leader bucket moved from memory to files (a replicated memory bucket does not survive a quorum's restart)")
}

func (s *skillService) openBuckets() error {
	r := s.opts.replicas
	kvs := []struct {
		kv *jetstream.KeyValue
		kc jetstream.KeyValueConfig
	}{
		{&s.bundles, jetstream.KeyValueConfig{Bucket: skillBundlesBucket, Description: "fleetmcp skill bundles: signed manifests by bundle ID", History: 1, Storage: jetstream.FileStorage, Replicas: r}},
		{&s.desired, jetstream.KeyValueConfig{Bucket: protocol.SkillsDesiredBucket, Description: "fleetmcp desired skills per host, signed", History: 1, Storage: jetstream.FileStorage, Replicas: r}},
		{&s.rolls, jetstream.KeyValueConfig{Bucket: rolloutsBucket, Description: "fleetmcp skill rollouts", History: 1, Storage: jetstream.FileStorage, Replicas: r}},
		{&s.leader, jetstream.KeyValueConfig{Bucket: leaderBucket, Description: "fleetmcp rollout controller leader", History: 1, TTL: s.opts.leaderTTL, Storage: leaderStorage(r), Replicas: r}},
	}
	for _, b := range kvs {
		if b.kc.Bucket == leaderBucket {
			s.dropMemoryLeader(b.kc)
		}
		kv, err := jskv.EnsureBucket(s.js, agentsLoadTimeout, b.kc)
		if err != nil {
			return fmt.Errorf("skills: %w", err)
		}
		*b.kv = kv
	}
	deadline := time.Now().Add(agentsLoadTimeout)
	for {
		ctx, cancel := context.WithTimeout(s.ctx, jskv.Timeout)
		obs, err := s.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: skillFilesBucket,
			Description: "fleetmcp skill files by SHA-256", Storage: jetstream.FileStorage, Replicas: r})
		cancel()
		if err == nil {
			s.files = obs
			return nil
		}
		if time.Now().After(deadline) || s.ctx.Err() != nil {
			return fmt.Errorf("skills: object store %s: %w", skillFilesBucket, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// follow keeps apply fed with kv's entries until close, after loading
// the current ones.
func (s *skillService) follow(kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry)) error {
	first, err := jskv.StartWatch(s.ctx, kv, jskv.WatchPatience)
	if err != nil {
		return fmt.Errorf("skills: %w", err)
	}
	loaded := make(chan struct{})
	s.wg.Go(func() { jskv.Follow(s.ctx, s.nc, kv, first, &s.wg, s.log, loaded, apply) })
	select {
	case <-loaded:
		return nil
	case <-time.After(agentsLoadTimeout):
		return fmt.Errorf("skills: bucket %s not loaded within %s", kv.Bucket(), agentsLoadTimeout)
	}
}

func (s *skillService) close() {
	for _, sub := range s.subs {
		_ = sub.Unsubscribe()
	}
	s.cancel()
	s.wg.Wait()
	s.status.stop()
}

func (s *skillService) applyBundle(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		s.mu.Lock()
		delete(s.manifest, e.Key())
		s.mu.Unlock()
		return
	}
	var rec bundleRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.BundleID != "sha256:"+e.Key() {
		s.log.Error("skills: ignoring a damaged bundle record", "key", e.Key(), "err", err)
		return
	}
	// Only a manifest this fleet signed, for the bundle its key names, is
	// served (to agents and as MCP Skills resources): a record written by
	// another user of the account is not, whatever files it names.
	if err := s.checkBundle(&rec); err != nil {
		s.log.Error("skills: ignoring a bundle record this fleet did not sign", "key", e.Key(), "err", err)
		s.mu.Lock()
		delete(s.manifest, e.Key())
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	s.manifest[e.Key()] = &rec
	s.mu.Unlock()
}

// checkBundle checks that rec's manifest is the bundle rec names, signed
// by a key of this fleet.
func (s *skillService) checkBundle(rec *bundleRecord) error {
	if got := rec.Manifest.BundleID(); got != rec.BundleID {
		return fmt.Errorf("its manifest is bundle %s", protocol.Excerpt(got))
	}
	return protocol.VerifyBytes(s.signer.verifiable(), protocol.PurposeManifest, rec.Manifest.CanonicalBytes(), rec.Signature)
}

func (s *skillService) applyRollout(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		s.mu.Lock()
		delete(s.rollouts, e.Key())
		s.mu.Unlock()
		return
	}
	r, err := decodeRollout(e.Key(), e.Value())
	if err != nil {
		s.log.Error("skills: ignoring a damaged rollout record", "key", e.Key(), "err", err)
		return
	}
	s.mu.Lock()
	if old, ok := s.rollouts[e.Key()]; !ok || old.rev < e.Revision() {
		s.rollouts[e.Key()] = rolloutEntry{r: r, rev: e.Revision()}
	}
	s.mu.Unlock()
	s.ctl.nudge()
}

// pushFile is one file of a bundle being pushed.
type pushFile struct {
	Path string
	Mode uint32
	Data []byte
}

// buildManifest checks a pushed bundle and returns its manifest: the
// bundle rules (protocol.Manifest.Validate) and the SKILL.md frontmatter
// by the Agent Skills rules, its name that of the skill.
func buildManifest(name string, files []pushFile) (protocol.Manifest, string, error) {
	refuse := func(format string, a ...any) (protocol.Manifest, string, error) {
		return protocol.Manifest{}, "", fmt.Errorf("%w: %s", ErrSkillRefused, fmt.Sprintf(format, a...))
	}
	if err := protocol.ValidateSkillName(name); err != nil {
		return refuse("%v", err)
	}
	if name == "rollouts" {
		return refuse(`a skill may not be called "rollouts": the admin API's rollouts live under that name`)
	}
	if len(files) > protocol.MaxBundleFiles {
		return refuse("the bundle has %d files; the limit is %d", len(files), protocol.MaxBundleFiles)
	}
	m := protocol.Manifest{Name: name}
	var total int64
	var skillMD []byte
	for _, f := range files {
		total += int64(len(f.Data))
		if total > protocol.MaxBundleBytes {
			return refuse("the bundle is over %d MiB", protocol.MaxBundleBytes>>20)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		sum := sha256.Sum256(f.Data)
		m.Files = append(m.Files, protocol.BundleFile{Path: f.Path, Size: int64(len(f.Data)), Mode: mode, SHA256: hex.EncodeToString(sum[:])})
		if f.Path == "SKILL.md" {
			skillMD = f.Data
		}
	}
	protocol.SortFiles(m.Files)
	if err := m.Validate(); err != nil {
		return refuse("%v", err)
	}
	meta, err := skillmd.Parse(name, skillMD)
	if err != nil {
		return refuse("SKILL.md: %v", err)
	}
	return m, strings.TrimSpace(meta.Description), nil
}

// push stores a bundle: files first (those not stored yet), then the
// signed manifest. The same bundle again is the same version (created
// false).
func (s *skillService) push(ctx context.Context, name string, files []pushFile, by string) (protocol.SkillPushResponse, error) {
	m, desc, err := buildManifest(name, files)
	if err != nil {
		return protocol.SkillPushResponse{}, err
	}
	id := m.BundleID()
	key := strings.TrimPrefix(id, "sha256:")
	resp := protocol.SkillPushResponse{Skill: name, BundleID: id, Files: len(m.Files), Bytes: m.TotalSize()}
	if old, err := s.bundle(ctx, key); err == nil {
		resp.PushedAt, resp.PushedBy = old.PushedAt, old.PushedBy
		return resp, nil
	} else if !errors.Is(err, ErrSkillNotFound) {
		return resp, err
	}
	byDigest := make(map[string][]byte, len(files))
	for _, f := range files {
		sum := sha256.Sum256(f.Data)
		byDigest[hex.EncodeToString(sum[:])] = f.Data
	}
	for digest, data := range byDigest {
		if err := s.storeFile(ctx, digest, data); err != nil {
			return resp, err
		}
	}
	rec := bundleRecord{SignedManifest: protocol.SignedManifest{Manifest: m, BundleID: id,
		Signature: s.signer.sign(protocol.PurposeManifest, m.CanonicalBytes())},
		PushedAt: s.now().UTC(), PushedBy: by, Description: desc}
	data, err := json.Marshal(&rec)
	if err != nil {
		return resp, err
	}
	cctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	if _, err := s.bundles.Create(cctx, key, data); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return resp, fmt.Errorf("store the manifest of %s: %w", id, err)
	} else if err == nil {
		resp.Created = true
		s.mu.Lock()
		s.manifest[key] = &rec
		s.mu.Unlock()
	}
	resp.PushedAt, resp.PushedBy = rec.PushedAt, rec.PushedBy
	return resp, nil
}

// storeFile puts a file into the object store unless it is there.
func (s *skillService) storeFile(ctx context.Context, digest string, data []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 4*jskv.Timeout)
	defer cancel()
	if info, err := s.files.GetInfo(ctx, digest); err == nil && info.Size == uint64(len(data)) {
		return nil
	}
	if _, err := s.files.PutBytes(ctx, digest, data); err != nil {
		return fmt.Errorf("store file %s: %w", digest, err)
	}
	return nil
}

// bundle returns a pushed bundle by its ID's hex: from the watch's copy,
// else the bucket.
func (s *skillService) bundle(ctx context.Context, key string) (*bundleRecord, error) {
	s.mu.RLock()
	rec, ok := s.manifest[key]
	s.mu.RUnlock()
	if ok {
		return rec, nil
	}
	e, err := jskv.Retry(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return s.bundles.Get(ctx, key) })
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return nil, fmt.Errorf("%w: no bundle sha256:%s was pushed", ErrSkillNotFound, protocol.Clip(key, 64))
	}
	if err != nil {
		return nil, fmt.Errorf("read bundle sha256:%s: %w", key, err)
	}
	var r bundleRecord
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return nil, fmt.Errorf("bundle sha256:%s is damaged: %w", key, err)
	}
	return &r, nil
}

// versions returns a skill's pushed bundles, newest first.
func (s *skillService) versions(name string) []*bundleRecord {
	s.mu.RLock()
	var out []*bundleRecord
	for _, r := range s.manifest {
		if r.Manifest.Name == name {
			out = append(out, r)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *bundleRecord) int {
		if c := b.PushedAt.Compare(a.PushedAt); c != 0 {
			return c
		}
		return strings.Compare(a.BundleID, b.BundleID)
	})
	return out
}

// skillNames returns the names of every pushed skill, sorted.
func (s *skillService) skillNames() []string {
	s.mu.RLock()
	seen := map[string]bool{}
	for _, r := range s.manifest {
		seen[r.Manifest.Name] = true
	}
	s.mu.RUnlock()
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// served returns the bundle the gateways serve for a skill: that of its
// most recent rollout not rolled back (nor a removal), else its most
// recently pushed one.
func (s *skillService) served(name string) (*bundleRecord, string, bool) {
	vs := s.versions(name)
	if len(vs) == 0 {
		return nil, "", false
	}
	var latest *rollout
	s.mu.RLock()
	for _, e := range s.rollouts {
		r := e.r
		if r.Skill != name || r.Remove || r.State == protocol.RolloutRolledBack {
			continue
		}
		if latest == nil || r.CreatedAt.After(latest.CreatedAt) {
			latest = r
		}
	}
	s.mu.RUnlock()
	if latest != nil {
		for _, v := range vs {
			if v.BundleID == latest.BundleID {
				return v, latest.ID, true
			}
		}
	}
	return vs[0], "", true
}

// selectHosts returns the enrolled hosts selector picks, sorted.
func (s *skillService) selectHosts(selector string) ([]fleetMember, error) {
	sel, err := policy.ParseSelector(selector)
	if err != nil {
		return nil, fmt.Errorf("%w: selector: %w", ErrSkillRefused, err)
	}
	var out []fleetMember
	for _, m := range s.fleet.members() {
		if sel.Match(m.Host, m.Labels) {
			out = append(out, m)
		}
	}
	return out, nil
}
