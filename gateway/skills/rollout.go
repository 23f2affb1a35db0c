package skills

import (
	"context"
	"crypto/rand"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file keeps the rollout records (KV rolloutsBucket, key = rollout
// ID): what to roll out, to which hosts in which order, and how far it
// got. The record is all the controller (rolloutctl.go) needs, so another
// replica resumes a rollout when the leader dies.

// Rollout defaults and limits.
const (
	defaultBatch        = "25%"
	defaultBatchTimeout = 10 * time.Minute
	// maxRolloutRecord keeps a rollout record under NATS's 1 MiB
	// message limit: about 10,000 hosts of 64-character names, with room
	// for what the record gains as the rollout goes (rolloutGrowth).
	maxRolloutRecord = 900 << 10
	// A record gains, per host, at most its index among the failed hosts
	// and among those of a previous bundle (up to 6 bytes each, the
	// comma included), and besides the reasons of the first
	// maxRolloutReasons failures, each clipped to maxRolloutReason bytes,
	// and the previous bundles' IDs.
	rolloutGrowthPerHost = 12
	rolloutGrowthFixed   = 48 << 10
	maxRolloutReasons    = 100
	maxRolloutReason     = 256
)

// rolloutGrowth is the most a record of n hosts grows while it runs,
// but for the IDs of more than a few dozen different previous bundles
// (which modifyRollout refuses beyond maxRolloutRecord).
func rolloutGrowth(n int) int { return n*rolloutGrowthPerHost + rolloutGrowthFixed }

// errRolloutFull: a change would take the record past maxRolloutRecord.
var errRolloutFull = errors.New("the rollout record would be larger than one NATS message")

// rollout is a rollout record.
type rollout struct {
	ID       string `json:"id"`
	Skill    string `json:"skill"`
	BundleID string `json:"bundle_id,omitempty"`
	Remove   bool   `json:"remove,omitempty"`
	Selector string `json:"selector"`
	// Hosts are the selected hosts in rollout order: the canary (the
	// first Canary online ones by name at the start), then the others by
	// name. Batch k after the canary is BatchSize of them.
	Hosts        []string      `json:"hosts"`
	Canary       int           `json:"canary"`
	Batch        string        `json:"batch"`
	BatchSize    int           `json:"batch_size"`
	MaxErrors    int           `json:"max_errors"`
	AutoRollback bool          `json:"auto_rollback,omitempty"`
	BatchTimeout time.Duration `json:"batch_timeout"`

	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Current is the batch being installed, since BatchStarted.
	Current      int       `json:"current"`
	BatchStarted time.Time `json:"batch_started"`
	// Prepared batches have their hosts' previous bundles recorded;
	// Written ones their desired states written.
	Prepared int `json:"prepared"`
	Written  int `json:"written"`
	// Previous maps each previous bundle ID ("" for none) to the indexes
	// in Hosts of the hosts that had it, for rollback.
	Previous map[string][]int `json:"previous,omitempty"`
	// FailedHosts are the indexes in Hosts of the hosts that failed (or
	// timed out), in the order they did; Acked of them were accepted by a
	// resume. Reasons holds why for the first maxRolloutReasons of them
	// (by host), each clipped: the record stays one message however many
	// hosts fail, and a host's own report of its failure stays in the
	// status stream.
	FailedHosts []int             `json:"failed_hosts,omitempty"`
	Reasons     map[string]string `json:"reasons,omitempty"`
	Acked       int               `json:"acked,omitempty"`
	// Failed is how records of earlier gateways named failed hosts (with
	// why); decodeRollout moves it into FailedHosts and Reasons.
	Failed map[string]string `json:"failed,omitempty"`
	// failed indexes FailedHosts, and previous maps a host's index to
	// its previous bundle ("" for none); both set by index.
	failed   map[int]bool
	previous []string
	// Undo asks the controller to write the rollback.
	Undo bool `json:"undo,omitempty"`

	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

func decodeRollout(key string, data []byte) (*rollout, error) {
	var r rollout
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, err
	}
	if r.ID != key {
		return nil, fmt.Errorf("rollout %q under key %q", r.ID, key)
	}
	if len(r.Failed) > 0 {
		// An earlier gateway's record: its failed hosts by index.
		pos := make(map[string]int, len(r.Hosts))
		for i, h := range r.Hosts {
			pos[h] = i
		}
		names := slices.Sorted(maps.Keys(r.Failed))
		for _, h := range names {
			if i, ok := pos[h]; ok {
				r.fail(i, r.Failed[h])
			}
		}
		r.Failed = nil
	}
	r.index()
	return &r, nil
}

// index builds the set of failed hosts and each host's previous bundle.
func (r *rollout) index() {
	r.failed = make(map[int]bool, len(r.FailedHosts))
	for _, i := range r.FailedHosts {
		r.failed[i] = true
	}
	r.previous = nil
	if len(r.Previous) > 0 {
		r.previous = make([]string, len(r.Hosts))
		for bundle, idx := range r.Previous {
			for _, i := range idx {
				if i >= 0 && i < len(r.previous) {
					r.previous[i] = bundle
				}
			}
		}
	}
}

// previousOf is the bundle host i had before the rollout ("" for none):
// what a rollback sets it back to.
func (r *rollout) previousOf(i int) string {
	if i < len(r.previous) {
		return r.previous[i]
	}
	return ""
}

// isFailed reports whether host i failed.
func (r *rollout) isFailed(i int) bool { return r.failed[i] }

// fail records that host i failed, for why (kept for the first
// maxRolloutReasons failures, clipped); a host that failed already is
// left as it is.
func (r *rollout) fail(i int, why string) {
	if r.failed == nil {
		r.index()
	}
	if r.failed[i] || i < 0 || i >= len(r.Hosts) {
		return
	}
	r.failed[i] = true
	r.FailedHosts = append(r.FailedHosts, i)
	if len(r.Reasons) < maxRolloutReasons {
		if r.Reasons == nil {
			r.Reasons = map[string]string{}
		}
		r.Reasons[r.Hosts[i]] = protocol.Clip(why, maxRolloutReason)
	}
}

// failure says why host i failed: its reason, or, past the first
// maxRolloutReasons failures, that it is not kept.
func (r *rollout) failure(i int) string {
	if why, ok := r.Reasons[r.Hosts[i]]; ok {
		return why
	}
	return fmt.Sprintf("failed or timed out (the rollout keeps the reasons of its first %d failures; the host's own report, if it sent one, is in its status)", maxRolloutReasons)
}

// batches is how many batches the rollout has.
func (r *rollout) batches() int {
	n := len(r.Hosts)
	c := min(r.Canary, n)
	k := 0
	if c > 0 {
		k = 1
	}
	if rest := n - c; rest > 0 {
		k += (rest + r.BatchSize - 1) / r.BatchSize
	}
	return k
}

// bounds returns batch k's hosts as indexes [lo, hi) into Hosts.
func (r *rollout) bounds(k int) (lo, hi int) {
	n := len(r.Hosts)
	c := min(r.Canary, n)
	if c > 0 {
		if k == 0 {
			return 0, c
		}
		k--
	}
	lo = min(n, c+k*r.BatchSize)
	return lo, min(n, lo+r.BatchSize)
}

// assigned is how many hosts (a prefix of Hosts) have their desired
// state written.
func (r *rollout) assigned() int {
	if r.Written == 0 {
		return 0
	}
	_, hi := r.bounds(r.Written - 1)
	return hi
}

// errors is the failures that count against MaxErrors.
func (r *rollout) errors() int { return len(r.FailedHosts) - r.Acked }

// parseBatch reads "N" or "N%" of n hosts into a batch size.
func parseBatch(batch string, n int) (int, error) {
	if pct, ok := strings.CutSuffix(batch, "%"); ok {
		p, err := strconv.Atoi(pct)
		if err != nil || p < 1 || p > 100 {
			return 0, fmt.Errorf("%w: batch %q: a percentage is 1%% to 100%%", ErrRefused, batch)
		}
		return max(1, int(math.Ceil(float64(n)*float64(p)/100))), nil
	}
	size, err := strconv.Atoi(batch)
	if err != nil || size < 1 {
		return 0, fmt.Errorf("%w: batch %q: give a number of hosts (10) or a percentage of them (25%%)", ErrRefused, batch)
	}
	return size, nil
}

// newRolloutID returns r- and 10 random base32 characters.
func newRolloutID() string {
	b := make([]byte, 7)
	_, _ = rand.Read(b)
	return "r-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))[:10]
}

// newRollout builds the record of a rollout request (without storing
// it).
func (s *Store) newRollout(req protocol.RolloutRequest, remove bool, by string) (*rollout, error) {
	refuse := func(format string, a ...any) (*rollout, error) {
		return nil, fmt.Errorf("%w: %s", ErrRefused, fmt.Sprintf(format, a...))
	}
	if err := protocol.ValidateSkillName(req.Skill); err != nil {
		return refuse("skill: %v", err)
	}
	r := &rollout{ID: newRolloutID(), Skill: req.Skill, Remove: remove, Selector: req.Selector, MaxErrors: req.MaxErrors,
		AutoRollback: req.AutoRollback, State: protocol.RolloutRunning, CreatedBy: by, Canary: 1, Batch: req.Batch, BatchTimeout: defaultBatchTimeout}
	r.CreatedAt = s.now().UTC()
	r.UpdatedAt, r.BatchStarted = r.CreatedAt, r.CreatedAt
	if !remove {
		vs := s.versions(req.Skill)
		if len(vs) == 0 {
			return nil, fmt.Errorf("%w: no bundle of skill %q was pushed; push it first (skill_push)", ErrNotFound, req.Skill)
		}
		r.BundleID = vs[0].BundleID
		if req.BundleID != "" {
			i := slices.IndexFunc(vs, func(v *bundleRecord) bool { return v.BundleID == req.BundleID })
			if i < 0 {
				return nil, fmt.Errorf("%w: skill %q has no version %s (see its versions)", ErrNotFound, req.Skill, protocol.Clip(req.BundleID, 80))
			}
			r.BundleID = req.BundleID
		}
	}
	if strings.TrimSpace(req.Selector) == "" {
		return refuse(`selector is empty: give one ("*" for every host, role=web, web-*)`)
	}
	if req.Canary != nil {
		r.Canary = *req.Canary
	}
	if r.Canary < 0 || r.MaxErrors < 0 {
		return refuse("canary and max_errors must not be negative")
	}
	if req.BatchTimeout != "" {
		d, err := time.ParseDuration(req.BatchTimeout)
		if err != nil || d < time.Second || d > 24*time.Hour {
			return refuse("batch_timeout %q: give a duration from 1s to 24h (e.g. 10m)", req.BatchTimeout)
		}
		r.BatchTimeout = d
	}
	members, err := s.selectHosts(req.Selector)
	if err != nil {
		return nil, err
	}
	if len(members) == 0 {
		return refuse("selector %q picks no enrolled host", req.Selector)
	}
	if r.Batch == "" {
		r.Batch = defaultBatch
	}
	if r.BatchSize, err = parseBatch(r.Batch, len(members)); err != nil {
		return nil, err
	}
	var canary, rest []string
	for _, m := range members {
		if len(canary) < r.Canary && m.Online {
			canary = append(canary, m.Host)
		} else {
			rest = append(rest, m.Host)
		}
	}
	r.Canary = len(canary)
	r.Hosts = append(canary, rest...)
	return r, nil
}

// startRollout stores a new rollout and supersedes the running or
// paused ones of its skill.
func (s *Store) startRollout(ctx context.Context, req protocol.RolloutRequest, remove bool, by string) (*rollout, error) {
	r, err := s.newRollout(req, remove, by)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if len(data)+rolloutGrowth(len(r.Hosts)) > maxRolloutRecord {
		return nil, fmt.Errorf("%w: the rollout's %d hosts do not fit one record; select fewer hosts (by labels) and roll out in parts", ErrRefused, len(r.Hosts))
	}
	cctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	rev, err := s.rolls.Create(cctx, r.ID, data)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("store rollout %s: %w", r.ID, err)
	}
	s.mu.Lock()
	if _, ok := s.rollouts[r.ID]; !ok {
		s.rollouts[r.ID] = rolloutEntry{r: r, rev: rev}
	}
	var older []string
	for id, e := range s.rollouts {
		if id != r.ID && e.r.Skill == r.Skill && (e.r.State == protocol.RolloutRunning || e.r.State == protocol.RolloutPaused) {
			older = append(older, id)
		}
	}
	s.mu.Unlock()
	for _, id := range older {
		_, err := s.modifyRollout(ctx, id, func(o *rollout) error {
			if o.State != protocol.RolloutRunning && o.State != protocol.RolloutPaused {
				return jskv.ErrSkip
			}
			o.State, o.Reason = protocol.RolloutSuperseded, "superseded by "+r.ID
			return nil
		})
		if err != nil {
			s.log.Warn("skills: could not mark an older rollout superseded", "rollout", id, "by", r.ID, "err", err)
		}
	}
	s.ctl.nudge()
	return r, nil
}

// modifyRollout applies change to a rollout record with compare-and-swap,
// reading it again as often as another write came first.
func (s *Store) modifyRollout(ctx context.Context, id string, change func(*rollout) error) (*rollout, error) {
	for {
		gctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
		e, err := s.rolls.Get(gctx, id)
		cancel()
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
			return nil, fmt.Errorf("%w: no rollout %q", ErrNotFound, protocol.Clip(id, 40))
		}
		if err != nil {
			return nil, fmt.Errorf("read rollout %s: %w", id, err)
		}
		r, err := decodeRollout(id, e.Value())
		if err != nil {
			return nil, fmt.Errorf("rollout %s is damaged: %w", id, err)
		}
		if err := change(r); errors.Is(err, jskv.ErrSkip) {
			return r, nil
		} else if err != nil {
			return nil, err
		}
		r.UpdatedAt = s.now().UTC()
		r.index()
		data, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		if len(data) > maxRolloutRecord {
			return nil, fmt.Errorf("rollout %s: %w (%d bytes)", id, errRolloutFull, len(data))
		}
		uctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
		rev, err := s.rolls.Update(uctx, id, data, e.Revision())
		cancel()
		if err == nil {
			s.mu.Lock()
			if old, ok := s.rollouts[id]; !ok || old.rev < rev {
				s.rollouts[id] = rolloutEntry{r: r, rev: rev}
			}
			s.mu.Unlock()
			return r, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) || ctx.Err() != nil {
			return nil, fmt.Errorf("update rollout %s: %w", id, err)
		}
	}
}

// control pauses, resumes or rolls back a rollout.
func (s *Store) control(ctx context.Context, id, action string) (*rollout, error) {
	r, err := s.modifyRollout(ctx, id, func(r *rollout) error {
		switch {
		case action == protocol.RolloutPause && r.State == protocol.RolloutRunning:
			r.State, r.Reason = protocol.RolloutPaused, "paused by request"
		case action == protocol.RolloutResume && r.State == protocol.RolloutPaused:
			r.State, r.Reason = protocol.RolloutRunning, ""
			r.Acked = len(r.FailedHosts)
			r.BatchStarted = s.now().UTC()
		case action == protocol.RolloutRollback && r.State != protocol.RolloutRolledBack && r.State != protocol.RolloutSuperseded:
			r.State, r.Reason, r.Undo = protocol.RolloutRolledBack, "rolled back by request", true
		case action != protocol.RolloutPause && action != protocol.RolloutResume && action != protocol.RolloutRollback:
			return fmt.Errorf("%w: action %q: use pause, resume or rollback", ErrRefused, protocol.Clip(action, 40))
		default:
			return fmt.Errorf("%w: rollout %s is %s; %s does not apply", ErrRolloutState, r.ID, r.State, action)
		}
		return nil
	})
	if err == nil {
		s.ctl.nudge()
	}
	return r, err
}

// rolloutByID returns a rollout from the watch's copy, else the bucket.
func (s *Store) rolloutByID(ctx context.Context, id string) (*rollout, error) {
	s.mu.RLock()
	e, ok := s.rollouts[id]
	s.mu.RUnlock()
	if ok {
		return e.r, nil
	}
	return s.modifyRollout(ctx, id, func(*rollout) error { return jskv.ErrSkip })
}

// hostState says where host stands in r: a SkillState state, or waiting
// or offline.
func (s *Store) hostState(r *rollout, i int) (state, reason string) {
	host := r.Hosts[i]
	if r.State == protocol.RolloutRolledBack {
		return s.rolledBackState(r, i)
	}
	if i >= r.assigned() {
		return protocol.RolloutHostWaiting, ""
	}
	st, ok := s.status.get(host, r.Skill)
	mine := ok && st.Rollout == r.ID
	failed := r.isFailed(i)
	switch {
	case r.Remove && ok && st.State == protocol.SkillRemoved:
		return protocol.SkillRemoved, ""
	case !r.Remove && ok && st.BundleID == r.BundleID && st.State == protocol.SkillTampered:
		// Installed once; the host found the files changed and
		// refuses them until it has installed them again.
		return protocol.SkillTampered, st.Reason
	case !r.Remove && ok && st.BundleID == r.BundleID && st.State == protocol.SkillInstalled:
		return protocol.SkillInstalled, ""
	case mine && (st.State == protocol.SkillFailed || st.State == protocol.SkillRefused):
		return st.State, st.Reason
	case failed:
		return protocol.SkillFailed, r.failure(i)
	case mine && st.State == protocol.SkillInstalling:
		return protocol.SkillInstalling, ""
	}
	if !s.fleet.Online(host) {
		return protocol.RolloutHostOffline, ""
	}
	return protocol.SkillPending, ""
}

// rolledBackState says where host i of a rolled back rollout stands:
// against the bundle it had before (installed again, or removed when it
// had none), not the bundle rolled back. A host of a batch that never
// started is skipped.
func (s *Store) rolledBackState(r *rollout, i int) (state, reason string) {
	host := r.Hosts[i]
	if i >= r.assigned() {
		return protocol.RolloutHostSkipped, ""
	}
	prev := r.previousOf(i)
	st, ok := s.status.get(host, r.Skill)
	mine := ok && st.Rollout == r.ID
	switch {
	case prev == "" && ok && st.State == protocol.SkillRemoved:
		return protocol.SkillRemoved, ""
	case prev != "" && ok && st.BundleID == prev && st.State == protocol.SkillTampered:
		return protocol.SkillTampered, st.Reason
	case prev != "" && ok && st.BundleID == prev && st.State == protocol.SkillInstalled:
		return protocol.SkillInstalled, ""
	case mine && st.BundleID == prev && (st.State == protocol.SkillFailed || st.State == protocol.SkillRefused):
		return st.State, st.Reason
	case mine && st.BundleID == prev && st.State == protocol.SkillInstalling:
		return protocol.SkillInstalling, ""
	}
	if !s.fleet.Online(host) {
		return protocol.RolloutHostOffline, ""
	}
	return protocol.SkillPending, ""
}

// info describes r and its hosts' progress; withHosts lists every host
// (up to protocol.MaxRolloutHostList).
func (s *Store) info(r *rollout, withHosts bool) protocol.RolloutInfo {
	in := protocol.RolloutInfo{ID: r.ID, Skill: r.Skill, BundleID: r.BundleID, Remove: r.Remove, Selector: r.Selector, State: r.State,
		Reason: r.Reason, Canary: r.Canary, Batch: r.Batch, MaxErrors: r.MaxErrors, AutoRollback: r.AutoRollback,
		BatchTimeout: r.BatchTimeout.String(), Hosts: len(r.Hosts), Batches: r.batches(), CurrentBatch: r.Current,
		CreatedAt: r.CreatedAt, CreatedBy: r.CreatedBy, UpdatedAt: r.UpdatedAt, Counts: map[string]int{}}
	list := withHosts && len(r.Hosts) <= protocol.MaxRolloutHostList
	for i, h := range r.Hosts {
		state, reason := s.hostState(r, i)
		in.Counts[state]++
		var active string
		if st, ok := s.status.get(h, r.Skill); ok {
			active = st.Active
		}
		if state == protocol.SkillFailed || state == protocol.SkillRefused || state == protocol.SkillTampered {
			if len(in.Problems) < protocol.MaxRolloutHostList {
				in.Problems = append(in.Problems, protocol.RolloutHost{Host: h, State: state, Active: active, Reason: reason})
			}
		}
		if list {
			in.HostStates = append(in.HostStates, protocol.RolloutHost{Host: h, State: state, Active: active, Reason: reason})
		}
	}
	return in
}

// rolloutList returns every rollout, newest first.
func (s *Store) rolloutList() []*rollout {
	s.mu.RLock()
	out := make([]*rollout, 0, len(s.rollouts))
	for _, e := range s.rollouts {
		out = append(out, e.r)
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b *rollout) int { return b.CreatedAt.Compare(a.CreatedAt) })
	return out
}
