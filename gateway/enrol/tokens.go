package enrol

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/bmatcuk/doublestar/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file keeps the join tokens: one record per token in the JetStream
// key-value bucket tokensBucket (key = the token's public id), holding
// the SHA-256 of its secret (never the secret), what it gives a host
// (labels), which names it may enrol and how many times. A use is
// consumed with compare-and-swap over the revision read, so two gateway
// replicas never spend the same use, and is given back when the
// enrolment fails after it. Tokens that stopped working are kept for
// tokenKeep so a list shows why, then the sweeper deletes them.
//
// Any user of the fleet's NATS account can write the bucket, and the
// seal (seal.go) does not stop one from putting back an old sealed
// copy: a spent token's copy from before its last use would give the use
// back. So each record names, inside its seal, the revision of the bucket
// it is stored at (Rev) and when the bucket's stream was made (Stream):
// it is written only at the bucket's next revision (the write expects the
// stream's last sequence as read), and revisions only grow, so a copy put
// back lands at another revision than the one it names; a stream deleted
// and made again (and filled up to the copy's revision) has another
// creation time. Such a record is refused for good (the token is
// "tampered"), as is a forged one; a deleted one is unknown. What this
// cannot catch is a stream restored from an old snapshot (the server
// keeps its creation time and sequences): so the gateways' runtime users
// may not delete, update, purge or restore the stream (runtimeDenied),
// nor any user the embedded server's data directory can sign; whoever
// holds an external setup's account key (kept offline) still can.

const (
	tokensBucket = protocol.TokensBucket
	// tokenKeep is how long a token that stopped working (expired, spent,
	// revoked) stays listed.
	tokenKeep = 24 * time.Hour
	// tokenSweepEvery is how often each gateway sweeps the tokens.
	tokenSweepEvery = 10 * time.Minute
	// Token lifetimes: the default and the longest.
	defaultTokenTTL = time.Hour
	maxTokenTTL     = 30 * 24 * time.Hour
	// maxTokenUses bounds the uses of one token.
	maxTokenUses = 100000
)

// tokenRecord is a join token as stored.
type tokenRecord struct {
	ID string `json:"id"`
	// SecretSHA256 is the hex SHA-256 of the token's secret.
	SecretSHA256 string            `json:"secret_sha256"`
	Labels       map[string]string `json:"labels,omitempty"`
	Name         string            `json:"name,omitempty"`
	NamePattern  string            `json:"name_pattern,omitempty"`
	Replace      string            `json:"replace,omitempty"`
	Uses         int               `json:"uses"`
	Used         int               `json:"used"`
	CreatedAt    time.Time         `json:"created_at"`
	CreatedBy    string            `json:"created_by,omitempty"`
	ExpiresAt    time.Time         `json:"expires_at"`
	RevokedAt    time.Time         `json:"revoked_at,omitzero"`
	RevokedBy    string            `json:"revoked_by,omitempty"`
	// SpentAt is when its last use was consumed.
	SpentAt time.Time `json:"spent_at,omitzero"`
	// EnrolKey is the public key of the token's enrol credential for
	// enrolment over NATS (natsenrol.go), if it has one.
	EnrolKey string `json:"enrol_key,omitempty"`
	// Rev is the revision of the bucket the record was written at, and
	// Stream when the bucket's stream was made.
	Rev    uint64    `json:"rev"`
	Stream time.Time `json:"stream"`
}

// state says whether the token works at now, and if not why.
func (t *tokenRecord) state(now time.Time) string {
	switch {
	case !t.RevokedAt.IsZero():
		return protocol.TokenRevoked
	case t.Used >= t.Uses:
		return protocol.TokenSpent
	case !now.Before(t.ExpiresAt):
		return protocol.TokenExpired
	}
	return protocol.TokenActive
}

// stoppedAt is when the token stopped working (zero: it works at now).
func (t *tokenRecord) stoppedAt(now time.Time) time.Time {
	var at []time.Time
	if !t.RevokedAt.IsZero() {
		at = append(at, t.RevokedAt)
	}
	if t.Used >= t.Uses {
		at = append(at, cmpOr(t.SpentAt, t.CreatedAt))
	}
	if !now.Before(t.ExpiresAt) {
		at = append(at, t.ExpiresAt)
	}
	if len(at) == 0 {
		return time.Time{}
	}
	return slices.MinFunc(at, time.Time.Compare)
}

func cmpOr(a, b time.Time) time.Time {
	if a.IsZero() {
		return b
	}
	return a
}

// info describes the token for the admin API.
func (t *tokenRecord) info(now time.Time) protocol.TokenInfo {
	return protocol.TokenInfo{ID: t.ID, State: t.state(now), Labels: maps.Clone(t.Labels), Name: t.Name, NamePattern: t.NamePattern,
		Replace: t.Replace, Uses: t.Uses, Used: t.Used, CreatedAt: t.CreatedAt, CreatedBy: t.CreatedBy, ExpiresAt: t.ExpiresAt,
		RevokedAt: t.RevokedAt, RevokedBy: t.RevokedBy, NATS: t.EnrolKey != ""}
}

// secretMatches compares the SHA-256 of secret with the stored one in
// constant time.
func (t *tokenRecord) secretMatches(secret []byte) bool {
	sum := sha256.Sum256(secret)
	want, err := hex.DecodeString(t.SecretSHA256)
	return err == nil && subtle.ConstantTimeCompare(sum[:], want) == 1
}

// refusal is the API error of a token that does not work at now.
func (t *tokenRecord) refusal(now time.Time) *protocol.APIError {
	switch t.state(now) {
	case protocol.TokenRevoked:
		return apiErr(protocol.APITokenRevoked, "join token %s was revoked on %s by %s: ask for a new token (fleetctl token create)",
			t.ID, t.RevokedAt.UTC().Format(time.RFC3339), t.RevokedBy)
	case protocol.TokenSpent:
		return apiErr(protocol.APITokenSpent, "join token %s is used up (%d of %d uses): ask for a new token (fleetctl token create)", t.ID, t.Used, t.Uses)
	case protocol.TokenExpired:
		return apiErr(protocol.APITokenExpired, "join token %s expired on %s: ask for a new token (fleetctl token create --ttl ...)",
			t.ID, t.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// allowName decides the host name an enrolment with the token gets for
// the asked name (may be empty when the token names the host, or to take
// the machine's own name, hostname, when it is a valid host name), and
// whether it may replace the key that holds it.
func (t *tokenRecord) allowName(asked, hostname string) (host string, replace bool, _ *protocol.APIError) {
	if asked == "" && t.Name == "" {
		asked = machineHostName(hostname)
	}
	switch {
	case t.Name != "" && asked != "" && asked != t.Name:
		return "", false, apiErr(protocol.APINameNotAllowed, "join token %s enrols only the host %s, not %s: join without --name, or ask for a token for %s",
			t.ID, t.Name, asked, asked)
	case t.Name != "":
		host = t.Name
	case asked == "":
		return "", false, apiErr(protocol.APINameNotAllowed, "join token %s needs the host's name, and this machine's name %q is not one (letters, digits, - and _): join with --name NAME", t.ID, protocol.Ellipsis(hostname, 80))
	case t.NamePattern != "":
		if ok, _ := doublestar.Match(t.NamePattern, asked); !ok {
			return "", false, apiErr(protocol.APINameNotAllowed, "join token %s enrols host names matching %s, and %s does not: choose a matching --name, or ask for another token",
				t.ID, t.NamePattern, asked)
		}
		host = asked
	default:
		host = asked
	}
	return host, t.Replace != "" && t.Replace == host, nil
}

// machineHostName is the host name a machine called hostname gets by
// default: its first DNS label in lowercase, when that is a valid host
// name ("" otherwise).
func machineHostName(hostname string) string {
	label, _, _ := strings.Cut(hostname, ".")
	label = strings.ToLower(label)
	if protocol.ValidateHost(label) != nil {
		return ""
	}
	return label
}

// newTokenRecord validates a creation request and returns the record of
// a new token, and the token itself.
func newTokenRecord(req *protocol.TokenCreateRequest, by string, now time.Time) (*tokenRecord, string, error) {
	ttl := defaultTokenTTL
	if req.TTL != "" {
		d, err := time.ParseDuration(req.TTL)
		if err != nil {
			return nil, "", fmt.Errorf("ttl %q is not a duration such as 30m, 1h or 720h", req.TTL)
		}
		ttl = d
	}
	var errs []error
	if ttl <= 0 || ttl > maxTokenTTL {
		errs = append(errs, fmt.Errorf("ttl %s: use more than 0 and at most %s (30 days)", ttl, maxTokenTTL))
	}
	uses := req.Uses
	if uses == 0 {
		uses = 1
	}
	if uses < 1 || uses > maxTokenUses {
		errs = append(errs, fmt.Errorf("uses %d: use 1 to %d", req.Uses, maxTokenUses))
	}
	if err := protocol.ValidateLabels(req.Labels); err != nil {
		errs = append(errs, fmt.Errorf("labels: %w", err))
	}
	errs = append(errs, validateTokenNames(req)...)
	if err := errors.Join(errs...); err != nil {
		return nil, "", err
	}
	id, secret, token := protocol.NewJoinToken()
	sum := sha256.Sum256(secret)
	return &tokenRecord{ID: id, SecretSHA256: hex.EncodeToString(sum[:]), Labels: maps.Clone(req.Labels), Name: req.Name,
		NamePattern: req.NamePattern, Replace: req.Replace, Uses: uses, CreatedAt: now.UTC(), CreatedBy: by,
		ExpiresAt: now.Add(ttl).UTC()}, token, nil
}

// validateTokenNames checks name, name_pattern and replace.
func validateTokenNames(req *protocol.TokenCreateRequest) []error {
	var errs []error
	if req.Name != "" && req.NamePattern != "" {
		errs = append(errs, errors.New("give name or name_pattern, not both"))
	}
	if req.Name != "" {
		if err := protocol.ValidateHost(req.Name); err != nil {
			errs = append(errs, fmt.Errorf("name: %w", err))
		}
	}
	if p := req.NamePattern; p != "" {
		if len(p) > 256 || !doublestar.ValidatePattern(p) || strings.ContainsAny(p, "/\\") {
			errs = append(errs, fmt.Errorf("name_pattern %q is not a valid pattern over host names (use * ? [a-z] {a,b}, e.g. web-*)", protocol.Ellipsis(p, 60)))
		}
	}
	if req.Replace != "" {
		err := protocol.ValidateHost(req.Replace)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("replace: %w", err))
		case req.Name != "" && req.Replace != req.Name:
			errs = append(errs, fmt.Errorf("replace %s: the token enrols only %s, so it could never replace %s; give --name %s", req.Replace, req.Name, req.Replace, req.Replace))
		case req.NamePattern != "":
			if ok, _ := doublestar.Match(req.NamePattern, req.Replace); !ok {
				errs = append(errs, fmt.Errorf("replace %s does not match name_pattern %s", req.Replace, req.NamePattern))
			}
		}
	}
	return errs
}

// tokenStore reads and writes the token records.
type tokenStore struct {
	js   jetstream.JetStream
	kv   jetstream.KeyValue
	seal *Seal
	log  *slog.Logger
	// now is the gateway's clock; retryWindow how long a spent token's
	// enrol credential stays good (Config.EnrolRetryWindow).
	now         func() time.Time
	retryWindow time.Duration
	// admin removes the marks of deleted tokens (a stream purge, which
	// the gateway's own user may not do); nil: they stay.
	admin jskv.Admin
}

func openTokenStore(js jetstream.JetStream, seal *Seal, replicas int, now func() time.Time, retryWindow time.Duration, admin jskv.Admin, log *slog.Logger) (*tokenStore, error) {
	kv, err := jskv.EnsureProtectedBucket(js, LoadTimeout, jetstream.KeyValueConfig{
		Bucket:      tokensBucket,
		Description: "fleetmcp join tokens: hashes of their secrets, labels, name rules and uses",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	}, admin, log)
	if err != nil {
		return nil, fmt.Errorf("join tokens: %w", err)
	}
	return &tokenStore{js: js, kv: kv, seal: seal, log: log, now: now, retryWindow: retryWindow, admin: admin}, nil
}

// ErrTokenNotFound: no token of that id (or it was swept).
var ErrTokenNotFound = errors.New("no such join token")

// errTokenPutBack: the record is stored at another revision than the one
// it was written at: an old copy put back.
var errTokenPutBack = errors.New("its record is a sealed copy put back in the bucket, not the one the gateways last wrote (a user of the fleet's NATS account wrote it)")

func (s *tokenStore) get(ctx context.Context, id string) (*tokenRecord, uint64, error) {
	info, err := s.streamInfo(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("read join token %s: %w", id, err)
	}
	e, err := jskv.Retry(ctx, func(ctx context.Context) (jetstream.KeyValueEntry, error) { return s.kv.Get(ctx, id) })
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w: %s", ErrTokenNotFound, id)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read join token %s: %w", id, err)
	}
	var t tokenRecord
	if err := s.seal.Open(sealToken, id, e.Value(), &t); err != nil || t.ID != id {
		return nil, 0, fmt.Errorf("join token %s: damaged or forged record (%v)", id, err)
	}
	if t.Rev != e.Revision() {
		return &t, e.Revision(), fmt.Errorf("join token %s: %w: it names revision %d, and is stored at %d", id, errTokenPutBack, t.Rev, e.Revision())
	}
	if !t.Stream.Equal(info.Created) {
		return &t, e.Revision(), fmt.Errorf("join token %s: %w: it was written to the bucket's stream made %s, and the stream now is one made %s",
			id, errTokenPutBack, t.Stream.UTC().Format(time.RFC3339Nano), info.Created.UTC().Format(time.RFC3339Nano))
	}
	return &t, e.Revision(), nil
}

// streamInfo describes the bucket's stream as it is now.
func (s *tokenStore) streamInfo(ctx context.Context) (*jetstream.StreamInfo, error) {
	st, err := jskv.Retry(ctx, s.kv.Status)
	if err != nil {
		return nil, fmt.Errorf("the join tokens' bucket %s: %w (was its stream deleted? the gateway refuses join tokens until it starts again)", tokensBucket, err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return nil, errors.New("the join tokens' bucket: unexpected status")
	}
	return bs.StreamInfo(), nil
}

// write stores t as the record of its token at the bucket's next
// revision, which t.Rev then names, if the token's record is still at
// rev (0: there is none) and nothing else was written to the bucket
// since its last revision was read. errTokenChanged when either moved.
func (s *tokenStore) write(ctx context.Context, t *tokenRecord, rev uint64) error {
	info, err := s.streamInfo(ctx)
	if err != nil {
		return fmt.Errorf("store join token %s: %w", t.ID, err)
	}
	last := info.State.LastSeq
	t.Rev, t.Stream = last+1, info.Created
	data, err := s.seal.Seal(sealToken, t.ID, t)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	_, err = s.js.PublishMsg(ctx, &nats.Msg{Subject: "$KV." + tokensBucket + "." + t.ID, Data: data},
		jetstream.WithExpectLastSequence(last), jetstream.WithExpectLastSequencePerSubject(rev))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return errTokenChanged
	}
	if err != nil {
		return fmt.Errorf("store join token %s: %w", t.ID, err)
	}
	return nil
}

func (s *tokenStore) create(ctx context.Context, t *tokenRecord) error {
	for {
		// Another token's write may come between the read of the last
		// revision and this one's: read it again.
		err := s.write(ctx, t, 0)
		if !errors.Is(err, errTokenChanged) || ctx.Err() != nil {
			return err
		}
		if _, _, gerr := s.get(ctx, t.ID); !errors.Is(gerr, ErrTokenNotFound) {
			return fmt.Errorf("store join token %s: the id is taken", t.ID)
		}
	}
}

// errTokenChanged: another write came first.
var errTokenChanged = errors.New("join token changed meanwhile")

func (s *tokenStore) update(ctx context.Context, t *tokenRecord, rev uint64) error {
	return s.write(ctx, t, rev)
}

// modify applies change to the token's record with compare-and-swap,
// again as often as another writer comes first. change returns jskv.ErrSkip
// when there is nothing to write.
func (s *tokenStore) modify(ctx context.Context, id string, change func(*tokenRecord) error) (*tokenRecord, error) {
	return jskv.ModifyCAS(ctx, func() (*tokenRecord, uint64, error) { return s.get(ctx, id) },
		func(t *tokenRecord, rev uint64) error { return s.update(ctx, t, rev) },
		errTokenChanged, change)
}

// consume spends one use of the token id whose secret is secret, if it
// works at now and check (the caller's name rules) accepts it. Every
// check is made again on the record as read before each attempt, so a
// use is never spent past Uses, nor on a token revoked meanwhile.
func (s *tokenStore) consume(ctx context.Context, id string, secret []byte, now func() time.Time, check func(*tokenRecord) *protocol.APIError) (*tokenRecord, *protocol.APIError) {
	var refused *protocol.APIError
	t, err := s.modify(ctx, id, func(t *tokenRecord) error {
		if !t.secretMatches(secret) {
			refused = unknownToken(id)
			return jskv.ErrSkip
		}
		at := now()
		if refused = t.refusal(at); refused != nil {
			return jskv.ErrSkip
		}
		if refused = check(t); refused != nil {
			return jskv.ErrSkip
		}
		t.Used++
		if t.Used >= t.Uses {
			t.SpentAt = at.UTC()
		}
		return nil
	})
	switch {
	case errors.Is(err, ErrTokenNotFound):
		return nil, unknownToken(id)
	case errors.Is(err, errTokenPutBack):
		s.log.Error("join token refused: its record was put back from an old copy", "token", id, "err", err)
		return nil, apiErr(protocol.APITokenRevoked, "join token %s cannot be used: %v; it is refused for good, ask for a new token (fleetctl token create)", id, errTokenPutBack)
	case err != nil:
		return nil, apiErr(protocol.APIUnavailable, "the gateway could not read or update join token %s (%v): try again in a moment", id, err)
	case refused != nil:
		return nil, refused
	}
	return t, nil
}

func unknownToken(id string) *protocol.APIError {
	return apiErr(protocol.APITokenUnknown, "join token %s is not known to this gateway (mistyped, from another gateway, or deleted a day after it stopped working): copy it again, or ask for a new one", id)
}

// giveBack returns a use consumed by an enrolment that failed after it.
func (s *tokenStore) giveBack(ctx context.Context, id string) error {
	_, err := s.modify(ctx, id, func(t *tokenRecord) error {
		if t.Used == 0 {
			return jskv.ErrSkip
		}
		t.Used--
		if t.Used < t.Uses {
			t.SpentAt = time.Time{}
		}
		return nil
	})
	return err
}

// revoke marks the token revoked by by; revoking it again changes
// nothing. A record put back from an old copy is written again revoked
// (its uses no longer matter).
func (s *tokenStore) revoke(ctx context.Context, id, by string, now time.Time) (*tokenRecord, error) {
	get := func() (*tokenRecord, uint64, error) {
		t, rev, err := s.get(ctx, id)
		if errors.Is(err, errTokenPutBack) {
			return t, rev, nil
		}
		return t, rev, err
	}
	return jskv.ModifyCAS(ctx, get, func(t *tokenRecord, rev uint64) error { return s.update(ctx, t, rev) }, errTokenChanged, func(t *tokenRecord) error {
		if !t.RevokedAt.IsZero() {
			return jskv.ErrSkip
		}
		t.RevokedAt, t.RevokedBy = now.UTC(), by
		return nil
	})
}

// tokenEntry is a record with its revision.
type tokenEntry struct {
	rec *tokenRecord
	rev uint64
	// putBack: the record names another revision or stream than its own
	// (an old copy put back); the token is refused.
	putBack bool
}

// all returns every token record, oldest first.
func (s *tokenStore) all(ctx context.Context) ([]tokenEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, 4*jskv.Timeout)
	defer cancel()
	info, err := s.streamInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("list join tokens: %w", err)
	}
	w, err := jskv.Retry(ctx, func(context.Context) (jetstream.KeyWatcher, error) {
		// The watch lives as long as ctx, not one attempt's.
		return s.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	})
	if err != nil {
		return nil, fmt.Errorf("list join tokens: %w", err)
	}
	defer w.Stop()
	var out []tokenEntry
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				slices.SortFunc(out, func(a, b tokenEntry) int { return a.rec.CreatedAt.Compare(b.rec.CreatedAt) })
				return out, nil
			}
			var t tokenRecord
			if err := s.seal.Open(sealToken, e.Key(), e.Value(), &t); err != nil || t.ID != e.Key() {
				s.log.Warn("join tokens: ignoring a damaged or forged record", "key", e.Key(), "err", err)
				continue
			}
			out = append(out, tokenEntry{rec: &t, rev: e.Revision(), putBack: t.Rev != e.Revision() || !t.Stream.Equal(info.Created)})
		case <-ctx.Done():
			return nil, fmt.Errorf("list join tokens: %w", ctx.Err())
		}
	}
}

// sweep deletes the tokens that stopped working more than tokenKeep
// before now. A delete names the revision read, so a token changed
// meanwhile (or deleted by another gateway) is left alone: several
// gateways sweeping at once do no harm.
func (s *tokenStore) sweep(ctx context.Context, now time.Time) (int, error) {
	all, err := s.all(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range all {
		at := e.rec.stoppedAt(now)
		if at.IsZero() || now.Sub(at) < tokenKeep {
			continue
		}
		if e.rec.EnrolKey != "" && now.Sub(e.rec.ExpiresAt) < tokenKeep {
			// Its record says its enrol credential is revoked until the
			// credential has expired.
			continue
		}
		dctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
		// A delete marker (the buckets take no rollup, so no purge).
		err := s.kv.Delete(dctx, e.rec.ID, jetstream.LastRevision(e.rev))
		cancel()
		if err == nil {
			n++
			s.log.Info("join token deleted a day after it stopped working", "token", e.rec.ID, "state", e.rec.state(now), "since", at)
		}
	}
	if s.admin == nil {
		return n, nil
	}
	pctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	// Delete markers older than the default (30 min) go too: that is a
	// stream purge, which the gateway's own user may not do.
	_ = s.admin(pctx, func(js jetstream.JetStream) error {
		kv, err := js.KeyValue(pctx, tokensBucket)
		if err != nil {
			return err
		}
		return kv.PurgeDeletes(pctx)
	})
	return n, nil
}

// SweepTokens deletes the tokens that stopped working more than a day
// before now, and says how many.
func (s *Service) SweepTokens(ctx context.Context, now time.Time) (int, error) {
	return s.tokens.sweep(ctx, now)
}

// SweepLoop sweeps the join tokens every tokenSweepEvery until ctx ends.
func (s *Service) SweepLoop(ctx context.Context) {
	t := time.NewTicker(tokenSweepEvery)
	defer t.Stop()
	for {
		if _, err := s.tokens.sweep(ctx, s.now()); err != nil && ctx.Err() == nil {
			s.log.Warn("join tokens: sweep failed; trying again later", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
