package skills

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// This file is the rollout controller. One replica at a time leads: it
// holds the key "leader" of leaderBucket, whose bucket TTL removes it
// when the leader stops renewing (Create takes it, Update at the revision
// held keeps it). The leader drives every running rollout from its
// record: it records the previous bundles of a batch's hosts, writes
// their desired states, waits for their status reports, counts failures,
// pauses or rolls back, and moves on. Every step is written to the record
// before the next begins, so a replica that takes over carries on where
// the leader stopped; desired-state writes are idempotent.

const (
	leaderKey = "leader"
	// desiredWorkers write a batch's desired states at once.
	desiredWorkers = 32
	// driveEvery is the longest the leader waits between two looks at
	// its rollouts (status reports bring the next look sooner).
	driveEvery = time.Second
	// repokeEvery is how often the leader pokes again the hosts of the
	// current batch that have not reported on it: a poke is sent once,
	// after the write, and is lost when the leader dies between the two
	// (the agent's own timer would read the record only minutes later).
	repokeEvery = 10 * time.Second
)

// controller elects the leader and drives the rollouts while leading.
type controller struct {
	s    *Store
	wake chan struct{}

	// scanned is when each rollout's earlier batches were last looked
	// at (drive loop only).
	scanned map[string]time.Time
	// poked is when each rollout's current batch was last poked by this
	// replica (drive loop only); a new leader pokes at once.
	poked map[string]time.Time

	mu      sync.Mutex
	leading bool
	rev     uint64
	renewed time.Time
}

func newController(s *Store) *controller {
	return &controller{s: s, wake: make(chan struct{}, 1), scanned: map[string]time.Time{}, poked: map[string]time.Time{}}
}

// nudge asks for a look at the rollouts soon.
func (c *controller) nudge() {
	if c == nil {
		return
	}
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// leader reports whether this replica leads: it holds the key and
// renewed it within half the TTL.
func (c *controller) leader() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leading && c.s.now().Sub(c.renewed) < c.s.opts.LeaderTTL/2
}

// run keeps the leader key on one goroutine and drives the rollouts on
// another, so that a long step (a batch of thousands of hosts) never
// delays the key's renewal.
func (c *controller) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { c.keepLeader(ctx) })
	c.driveLoop(ctx)
	wg.Wait()
}

// keepLeader takes or renews the leader key every fifth of its TTL, and
// gives it up at a clean stop.
func (c *controller) keepLeader(ctx context.Context) {
	keep := time.NewTicker(c.s.opts.LeaderTTL / 5)
	defer keep.Stop()
	c.campaign(ctx)
	for {
		select {
		case <-ctx.Done():
			c.resign()
			return
		case <-keep.C:
			c.campaign(ctx)
		}
	}
}

// driveLoop drives the rollouts while this replica leads.
func (c *controller) driveLoop(ctx context.Context) {
	s := c.s
	tick := time.NewTicker(s.opts.Tick)
	defer tick.Stop()
	dirty, last := true, time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
			dirty = true
		case <-s.status.next():
			dirty = true
		case <-tick.C:
			if (dirty || time.Since(last) >= driveEvery) && c.leader() {
				dirty, last = false, time.Now()
				c.drive(ctx)
			}
		}
	}
}

// campaign takes or keeps the leader key.
func (c *controller) campaign(ctx context.Context) {
	s := c.s
	cctx, cancel := context.WithTimeout(ctx, jskv.Timeout)
	defer cancel()
	c.mu.Lock()
	leading, rev := c.leading, c.rev
	c.mu.Unlock()
	var err error
	renewed := s.now()
	if leading {
		rev, err = s.leader.Update(cctx, leaderKey, []byte(s.opts.ID), rev)
	} else {
		rev, err = s.leader.Create(cctx, leaderKey, []byte(s.opts.ID))
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		// A write whose answer was lost may have made the key ours at a
		// revision this replica did not learn: it still leads, as of
		// when the server stored that write.
		if e, gerr := s.leader.Get(cctx, leaderKey); gerr == nil && string(e.Value()) == s.opts.ID {
			rev, err = e.Revision(), nil
			if e.Created().Before(renewed) {
				renewed = e.Created()
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil && leading && !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyNotFound) {
		// No answer in time: the key may still be ours; leader() stops
		// counting on it once half its TTL passed without a renewal.
		return
	}
	if err != nil {
		if c.leading {
			s.log.Warn("skills: no longer the rollout controller", "err", err)
		}
		c.leading = false
		return
	}
	if !c.leading {
		s.log.Info("skills: this gateway drives the rollouts", "id", s.opts.ID)
		c.nudgeLocked()
	}
	c.leading, c.rev, c.renewed = true, rev, renewed
}

func (c *controller) nudgeLocked() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// resign gives the key up at a clean stop, so another replica takes
// over at once.
func (c *controller) resign() {
	c.mu.Lock()
	leading, rev := c.leading, c.rev
	c.leading = false
	c.mu.Unlock()
	if !leading || !c.s.nc.IsConnected() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), jskv.Timeout)
	defer cancel()
	_ = c.s.leader.Delete(ctx, leaderKey, jetstream.LastRevision(rev))
}

// drive takes every rollout one step.
func (c *controller) drive(ctx context.Context) {
	for _, r := range c.s.rolloutList() {
		if ctx.Err() != nil || !c.leader() {
			return
		}
		if r.State != protocol.RolloutRunning && !r.Undo {
			delete(c.scanned, r.ID)
			delete(c.poked, r.ID)
			continue
		}
		err := c.step(ctx, r)
		if errors.Is(err, errRolloutFull) {
			// It cannot go on as it is: paused, and said why.
			err = c.pauseFull(ctx, r.ID, err)
		}
		if err != nil && ctx.Err() == nil {
			c.s.log.Warn("skills: rollout step failed; retrying", "rollout", r.ID, "err", err)
		}
	}
}

// step moves one rollout on.
func (c *controller) step(ctx context.Context, r *rollout) error {
	s := c.s
	if r.Undo {
		return c.rollback(ctx, r)
	}
	k := r.Current
	if r.Written <= k {
		return c.writeBatch(ctx, r, k)
	}
	now := s.now()
	lo, hi := r.bounds(k)
	failed := map[int]string{}
	var silent []string
	done := true
	// The hosts of earlier batches (which may fail once they come back)
	// are looked at once a driveEvery; the current batch's every time.
	first := lo
	if now.Sub(c.scanned[r.ID]) >= driveEvery {
		first = 0
		c.scanned[r.ID] = now
	}
	for i := first; i < r.assigned(); i++ {
		state, reason := s.hostState(r, i)
		switch {
		case state == protocol.SkillFailed:
			if !r.isFailed(i) {
				failed[i] = reason
			}
		case i < lo || i >= hi || state == protocol.SkillInstalled || state == protocol.SkillRemoved ||
			state == protocol.SkillRefused || state == protocol.RolloutHostOffline || state == protocol.SkillTampered:
		case now.Sub(r.BatchStarted) > r.BatchTimeout:
			failed[i] = fmt.Sprintf("timed out: still %s after %s", state, r.BatchTimeout)
		default:
			done = false
			if state == protocol.SkillPending {
				silent = append(silent, r.Hosts[i])
			}
		}
	}
	c.repoke(r.ID, silent, now)
	if len(failed) == 0 && !done {
		return nil
	}
	_, err := s.modifyRollout(ctx, r.ID, func(r *rollout) error {
		if r.State != protocol.RolloutRunning || r.Current != k {
			return jskv.ErrSkip
		}
		for _, i := range slices.Sorted(maps.Keys(failed)) {
			r.fail(i, failed[i])
		}
		switch {
		case r.errors() > r.MaxErrors && r.AutoRollback:
			r.State, r.Undo = protocol.RolloutRolledBack, true
			r.Reason = fmt.Sprintf("rolled back: %d hosts failed, more than max_errors %d", r.errors(), r.MaxErrors)
		case r.errors() > r.MaxErrors:
			r.State = protocol.RolloutPaused
			r.Reason = fmt.Sprintf("paused: %d hosts failed, more than max_errors %d; resume to go on, or roll back", r.errors(), r.MaxErrors)
		case done && k+1 >= r.batches():
			r.State = protocol.RolloutDone
		case done:
			r.Current, r.BatchStarted = k+1, s.now().UTC()
		}
		return nil
	})
	c.nudge()
	return err
}

// repoke pokes hosts of rollout id's current batch that have not
// reported on it, at most once a repokeEvery.
func (c *controller) repoke(id string, hosts []string, now time.Time) {
	if len(hosts) == 0 || now.Sub(c.poked[id]) < repokeEvery {
		return
	}
	c.poked[id] = now
	for _, h := range hosts {
		c.s.opts.Poke(h)
	}
}

// pauseFull pauses rollout id, whose record cannot take what the next
// step would add (err), and says why.
func (c *controller) pauseFull(ctx context.Context, id string, full error) error {
	_, err := c.s.modifyRollout(ctx, id, func(r *rollout) error {
		if r.State != protocol.RolloutRunning {
			return jskv.ErrSkip
		}
		r.State = protocol.RolloutPaused
		r.Reason = fmt.Sprintf("paused: %v; roll back, or roll out to fewer hosts at once", full)
		return nil
	})
	if err == nil {
		c.s.log.Warn("skills: rollout paused: its record is full", "rollout", id, "err", full)
	}
	return err
}

// writeBatch records the previous bundles of batch k's hosts, then writes
// their desired states.
func (c *controller) writeBatch(ctx context.Context, r *rollout, k int) error {
	s := c.s
	lo, hi := r.bounds(k)
	if r.Prepared <= k {
		prev := make([]string, hi-lo)
		mine := make([]bool, hi-lo)
		err := parallel(ctx, hi-lo, func(j int) error {
			d, _, err := s.readDesired(ctx, r.Hosts[lo+j])
			if err != nil {
				return err
			}
			cur, ok := d.Skills[r.Skill]
			prev[j], mine[j] = cur.BundleID, ok && cur.Rollout == r.ID
			return nil
		})
		if err != nil {
			return err
		}
		if _, err := s.modifyRollout(ctx, r.ID, func(r *rollout) error {
			if r.Prepared > k {
				return jskv.ErrSkip
			}
			if r.Previous == nil {
				r.Previous = map[string][]int{}
			}
			for j, p := range prev {
				if !mine[j] {
					r.Previous[p] = append(r.Previous[p], lo+j)
				}
			}
			r.Prepared = k + 1
			return nil
		}); err != nil {
			return err
		}
	}
	want := protocol.DesiredSkill{BundleID: r.BundleID, Remove: r.Remove, Rollout: r.ID}
	err := parallel(ctx, hi-lo, func(j int) error {
		_, err := s.setDesired(ctx, r.Hosts[lo+j], func(skills map[string]protocol.DesiredSkill) bool {
			return s.assign(skills, r, want)
		})
		return err
	})
	if err != nil {
		return err
	}
	_, err = s.modifyRollout(ctx, r.ID, func(r *rollout) error {
		if r.Written > k {
			return jskv.ErrSkip
		}
		r.Written = k + 1
		if r.Current == k {
			r.BatchStarted = s.now().UTC()
		}
		return nil
	})
	c.poked[r.ID] = s.now()
	c.nudge()
	return err
}

// assign sets a host's desired skill for r, unless it already is or a
// newer rollout of the skill set it.
func (s *Store) assign(skills map[string]protocol.DesiredSkill, r *rollout, want protocol.DesiredSkill) bool {
	cur, ok := skills[r.Skill]
	if ok && cur == want {
		return false
	}
	if ok && cur.Rollout != r.ID {
		s.mu.RLock()
		other, known := s.rollouts[cur.Rollout]
		s.mu.RUnlock()
		if known && other.r.CreatedAt.After(r.CreatedAt) {
			return false
		}
	}
	skills[r.Skill] = want
	return true
}

// rollback sets every assigned host's skill back to its previous bundle
// (or removes it when it had none), then clears Undo.
func (c *controller) rollback(ctx context.Context, r *rollout) error {
	s := c.s
	prev := make([]string, len(r.Hosts))
	for bundle, idx := range r.Previous {
		for _, i := range idx {
			if i < len(prev) {
				prev[i] = bundle
			}
		}
	}
	n := min(r.Prepared, r.batches())
	hi := 0
	if n > 0 {
		_, hi = r.bounds(n - 1)
	}
	err := parallel(ctx, hi, func(i int) error {
		want := protocol.DesiredSkill{BundleID: prev[i], Remove: prev[i] == "", Rollout: r.ID}
		_, err := s.setDesired(ctx, r.Hosts[i], func(skills map[string]protocol.DesiredSkill) bool {
			cur, ok := skills[r.Skill]
			if !ok || cur.Rollout != r.ID || cur == want {
				// Another rollout has taken the host over since.
				return false
			}
			skills[r.Skill] = want
			return true
		})
		return err
	})
	if err != nil {
		return err
	}
	_, err = s.modifyRollout(ctx, r.ID, func(r *rollout) error {
		if !r.Undo {
			return jskv.ErrSkip
		}
		r.Undo = false
		return nil
	})
	return err
}

// parallel runs do(0..n-1), desiredWorkers at once, and returns the
// first error.
func parallel(ctx context.Context, n int, do func(int) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan int)
	for range min(n, desiredWorkers) {
		wg.Go(func() {
			for i := range next {
				if err := do(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}
