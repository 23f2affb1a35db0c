package skills

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file serves agents their skill manifests and files. Every gateway
// answers protocol.SkillsManifestSubjectAll and SkillsBlobSubjectAll in
// one queue group; the host in the subject is the agent's NATS identity
// (its permissions allow it no other host's subjects), and it must be
// enrolled and not revoked. Files come from a bounded in-memory cache, so
// a rollout to thousands of hosts reads each file from the object store
// about once per gateway; concurrent misses of one file share one read.

const (
	skillsQueue = "fleet-gateway-skills"
	// skillWorkers answer agents' requests, off the subscriptions'
	// goroutines.
	skillWorkers = 16
	// defaultSkillCache bounds the file cache.
	defaultSkillCache = 64 << 20
)

// serve subscribes the manifest and blob subjects.
func (s *Store) serve() error {
	for _, subj := range []string{protocol.SkillsDesiredSubjectAll, protocol.SkillsManifestSubjectAll, protocol.SkillsBlobSubjectAll} {
		sub, err := s.nc.ChanQueueSubscribe(subj, skillsQueue, s.work)
		if err != nil {
			return fmt.Errorf("skills: subscribe %s: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	for range skillWorkers {
		s.wg.Go(func() {
			for {
				select {
				case <-s.ctx.Done():
					return
				case m := <-s.work:
					s.answer(m)
				}
			}
		})
	}
	return s.nc.Flush()
}

// subjectHost returns the host of fleet.v1.agent.HOST.skills.X.
func subjectHost(subject string) string {
	parts := strings.Split(subject, ".")
	if len(parts) != 6 {
		return ""
	}
	return parts[3]
}

func (s *Store) answer(m *nats.Msg) {
	host := subjectHost(m.Subject)
	if !protocol.IsAgentReply(host, m.Reply) {
		// The answer goes to the agent's own inbox or nowhere: the
		// gateway's connection may publish anywhere.
		s.log.Warn("skills: ignoring a request whose reply subject is not the agent's inbox", "subject", m.Subject,
			"reply", protocol.Clip(m.Reply, 120))
		return
	}
	if err := s.fleet.AgentOK(host); err != nil {
		s.replyError(m, protocol.APIForbidden, err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 4*jskv.Timeout)
	defer cancel()
	switch {
	case strings.HasSuffix(m.Subject, ".desired"):
		s.answerDesired(ctx, m, host)
	case strings.HasSuffix(m.Subject, ".manifest"):
		s.answerManifest(ctx, m)
	default:
		s.answerBlob(ctx, m)
	}
}

// answerDesired answers host's read of its desired state with the record
// as the bucket keeps it (the agent checks its signature and host), or
// Status 404 when it has none.
func (s *Store) answerDesired(ctx context.Context, m *nats.Msg, host string) {
	out := nats.NewMsg(m.Reply)
	e, err := jskv.Retry(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return s.desired.Get(ctx, host) })
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		out.Header.Set("Status", "404")
	case err != nil:
		s.replyError(m, protocol.APIUnavailable, fmt.Sprintf("read the desired skills of %s: %v", host, err))
		return
	default:
		out.Header.Set("Nats-Subject", "$KV."+protocol.SkillsDesiredBucket+"."+host)
		out.Header.Set("Nats-Sequence", fmt.Sprint(e.Revision()))
		out.Data = s.resignDesired(e.Value())
	}
	_ = m.RespondMsg(out)
}

func (s *Store) answerManifest(ctx context.Context, m *nats.Msg) {
	var req protocol.SkillManifestRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		s.replyError(m, protocol.APIBadRequest, "manifest request is not valid JSON: "+err.Error())
		return
	}
	key, ok := strings.CutPrefix(req.BundleID, "sha256:")
	if !ok || !validHexDigest(key) {
		s.replyError(m, protocol.APIBadRequest, fmt.Sprintf("bundle ID %q is not sha256: and 64 lowercase hex digits", protocol.Clip(req.BundleID, 80)))
		return
	}
	rec, err := s.bundle(ctx, key)
	if errors.Is(err, ErrNotFound) {
		s.replyError(m, protocol.APINotFound, err.Error())
		return
	}
	if err != nil {
		s.replyError(m, protocol.APIUnavailable, err.Error())
		return
	}
	sm := rec.SignedManifest
	sm.Signature = s.signer.Resign(protocol.PurposeManifest, sm.Manifest.CanonicalBytes(), sm.Signature)
	data, _ := json.Marshal(&sm)
	_ = m.Respond(data)
}

func (s *Store) answerBlob(ctx context.Context, m *nats.Msg) {
	var req protocol.SkillBlobRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		s.replyError(m, protocol.APIBadRequest, "blob request is not valid JSON: "+err.Error())
		return
	}
	switch {
	case !validHexDigest(req.SHA256):
		s.replyError(m, protocol.APIBadRequest, fmt.Sprintf("%q is not a lowercase hex SHA-256", protocol.Clip(req.SHA256, 80)))
		return
	case req.Offset < 0 || req.Length <= 0 || req.Length > protocol.MaxBlobChunk:
		s.replyError(m, protocol.APIBadRequest, fmt.Sprintf("offset %d, length %d: ask for 1 to %d bytes from an offset of 0 or more", req.Offset, req.Length, protocol.MaxBlobChunk))
		return
	}
	data, err := s.cache.get(ctx, req.SHA256, s.readFile)
	if errors.Is(err, ErrNotFound) {
		s.replyError(m, protocol.APINotFound, err.Error())
		return
	}
	if err != nil {
		s.replyError(m, protocol.APIUnavailable, err.Error())
		return
	}
	if req.Offset > int64(len(data)) {
		s.replyError(m, protocol.APIBadRequest, fmt.Sprintf("offset %d is beyond the file's %d bytes", req.Offset, len(data)))
		return
	}
	_ = m.Respond(data[req.Offset:min(int64(len(data)), req.Offset+req.Length)])
}

func (s *Store) replyError(m *nats.Msg, code protocol.APICode, msg string) {
	data, _ := json.Marshal(&protocol.APIError{Code: code, Message: msg})
	reply := nats.NewMsg(m.Reply)
	reply.Header.Set(protocol.SkillsErrorHeader, string(code))
	reply.Data = data
	_ = m.RespondMsg(reply)
}

// readFile reads a file from the object store and checks its digest.
func (s *Store) readFile(ctx context.Context, digest string) ([]byte, error) {
	data, err := s.files.GetBytes(ctx, digest)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, fmt.Errorf("%w: no file with SHA-256 %s is stored", ErrNotFound, digest)
	}
	if err != nil {
		return nil, fmt.Errorf("read file %s: %w", digest, err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != digest {
		return nil, fmt.Errorf("file %s is damaged in the object store", digest)
	}
	return data, nil
}

func validHexDigest(s string) bool {
	if len(s) != 2*sha256.Size || strings.ToLower(s) != s {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// blobCache keeps recently served files, at most max bytes, least
// recently used out first. Misses of one digest at once share one load.
type blobCache struct {
	mu       sync.Mutex
	max, n   int64
	lru      *list.List // of *blobEntry, most recent first
	byDigest map[string]*list.Element
	loading  map[string]*blobLoad
	// loads counts object store reads, for tests and measurements.
	loads int64
}

type blobEntry struct {
	digest string
	data   []byte
}

type blobLoad struct {
	done chan struct{}
	data []byte
	err  error
}

func newBlobCache(max int64) *blobCache {
	if max <= 0 {
		max = defaultSkillCache
	}
	return &blobCache{max: max, lru: list.New(), byDigest: map[string]*list.Element{}, loading: map[string]*blobLoad{}}
}

// get returns the file digest, loading it with load on a miss.
func (c *blobCache) get(ctx context.Context, digest string, load func(context.Context, string) ([]byte, error)) ([]byte, error) {
	c.mu.Lock()
	if el, ok := c.byDigest[digest]; ok {
		c.lru.MoveToFront(el)
		c.mu.Unlock()
		return el.Value.(*blobEntry).data, nil
	}
	if l, ok := c.loading[digest]; ok {
		c.mu.Unlock()
		select {
		case <-l.done:
			return l.data, l.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	l := &blobLoad{done: make(chan struct{})}
	c.loading[digest] = l
	c.loads++
	c.mu.Unlock()
	l.data, l.err = load(ctx, digest)
	c.mu.Lock()
	delete(c.loading, digest)
	if l.err == nil {
		c.add(digest, l.data)
	}
	c.mu.Unlock()
	close(l.done)
	return l.data, l.err
}

// add keeps data unless it alone is over the bound; c.mu is held.
func (c *blobCache) add(digest string, data []byte) {
	size := int64(len(data))
	if size > c.max {
		return
	}
	for c.n+size > c.max {
		el := c.lru.Back()
		e := el.Value.(*blobEntry)
		c.lru.Remove(el)
		delete(c.byDigest, e.digest)
		c.n -= int64(len(e.data))
	}
	c.byDigest[digest] = c.lru.PushFront(&blobEntry{digest: digest, data: data})
	c.n += size
}

// stats returns the bytes cached and the loads made.
func (c *blobCache) stats() (bytes, loads int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.loads
}

// resignDesired returns a stored desired state signed with the current
// key: one signed with an older key of this fleet (before a rotation) is
// signed again, so that hosts that retired that key still take it.
// Anything else is passed on as it is, for the agent to refuse.
func (s *Store) resignDesired(data []byte) []byte {
	var sd protocol.SignedDesiredState
	if json.Unmarshal(data, &sd) != nil {
		return data
	}
	sig := s.signer.Resign(protocol.PurposeDesired, sd.State.CanonicalBytes(), sd.Signature)
	if sig == sd.Signature {
		return data
	}
	sd.Signature = sig
	if out, err := json.Marshal(&sd); err == nil {
		return out
	}
	return data
}
