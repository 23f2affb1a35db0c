package skills

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// rolloutFixture is a skill store, a fleet and its simulated agents.
type rolloutFixture struct {
	t      *testing.T
	ns     *server.Server
	key    *testKey
	fleet  *fakeFleet
	s      *Store
	agents map[string]*simAgent
}

func newRolloutFixture(t *testing.T, hosts []string, behave map[string]string) *rolloutFixture {
	t.Helper()
	f := &rolloutFixture{t: t, ns: startJetStream(t), key: testSigningKey(t), fleet: newFakeFleet(hosts...), agents: map[string]*simAgent{}}
	f.s = testSkills(t, f.ns, f.fleet, f.key, "a")
	waitUntil(t, "the service leads", f.s.ctl.leader)
	for _, h := range hosts {
		b := behave[h]
		if b == "" {
			b = simInstall
		}
		if b == "offline" {
			f.fleet.setOnline(h, false)
			continue
		}
		f.agents[h] = startSimAgent(t, f.ns, h, f.key.trusted(), b)
	}
	return f
}

func (f *rolloutFixture) push(name, version string) string {
	f.t.Helper()
	resp, err := f.s.push(context.Background(), name, []protocol.SkillPushFile{{Path: "SKILL.md", Data: skillMD(name, "Version "+version+".")},
		{Path: "notes.txt", Data: []byte("version " + version)}}, "test")
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.BundleID
}

func (f *rolloutFixture) start(req protocol.RolloutRequest) string {
	f.t.Helper()
	r, err := f.s.startRollout(context.Background(), req, false, "test")
	if err != nil {
		f.t.Fatal(err)
	}
	return r.ID
}

// waitState waits until the rollout is in state and returns its info.
func (f *rolloutFixture) waitState(id, state string) protocol.RolloutInfo {
	f.t.Helper()
	var in protocol.RolloutInfo
	waitUntil(f.t, "rollout "+id+" "+state, func() bool {
		in = rolloutInfo(f.t, f.s, id)
		return in.State == state
	})
	return in
}

// desired returns host's desired skill name ("" bundle: none).
func (f *rolloutFixture) desired(host, name string) protocol.DesiredSkill {
	f.t.Helper()
	d, _, err := f.s.readDesired(context.Background(), host)
	if err != nil {
		f.t.Fatal(err)
	}
	return d.Skills[name]
}

// The canary installs alone; the other hosts get their desired state only
// after it reported, then in batches.
func TestRolloutCanaryThenBatches(t *testing.T) {
	hosts := []string{"web-1", "web-2", "web-3", "web-4", "web-5"}
	f := newRolloutFixture(t, hosts, nil)
	hold := make(chan struct{})
	f.agents["web-1"].setHold(hold)
	b := f.push("deploy", "1")
	id := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "role=web", Canary: intp(1), Batch: "2"})
	var in protocol.RolloutInfo
	waitUntil(t, "the canary is assigned", func() bool {
		in = rolloutInfo(t, f.s, id)
		return in.Counts[protocol.RolloutHostWaiting] == 4
	})
	if in.Batches != 3 || f.desired("web-1", "deploy").BundleID != b {
		t.Fatalf("while the canary installs: %+v", in)
	}
	// Give the controller time to act wrongly before the canary answers.
	time.Sleep(200 * time.Millisecond)
	for _, h := range hosts[1:] {
		if d := f.desired(h, "deploy"); d.BundleID != "" {
			t.Fatalf("%s got the bundle before the canary installed", h)
		}
	}
	close(hold)
	in = f.waitState(id, protocol.RolloutDone)
	if in.Counts[protocol.SkillInstalled] != 5 {
		t.Fatalf("done with %v", in.Counts)
	}
	for _, h := range hosts {
		if d := f.desired(h, "deploy"); d.BundleID != b || d.Rollout != id {
			t.Fatalf("%s desired = %+v", h, d)
		}
	}
}

// An offline host is pending: its desired state is written, it neither
// blocks nor counts as an error, and it installs when it returns. A host
// whose policy refuses the skill is reported, and does not count either.
func TestRolloutOfflineAndRefused(t *testing.T) {
	hosts := []string{"web-1", "web-2", "web-3"}
	f := newRolloutFixture(t, hosts, map[string]string{"web-2": "offline", "web-3": simRefuse})
	b := f.push("deploy", "1")
	id := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "*", Canary: intp(1), Batch: "100%"})
	in := f.waitState(id, protocol.RolloutDone)
	if in.Counts[protocol.SkillInstalled] != 1 || in.Counts[protocol.RolloutHostOffline] != 1 || in.Counts[protocol.SkillRefused] != 1 {
		t.Fatalf("counts = %v", in.Counts)
	}
	if len(in.Problems) != 1 || in.Problems[0].Host != "web-3" || !strings.Contains(in.Problems[0].Reason, "policy") {
		t.Fatalf("problems = %+v", in.Problems)
	}
	if d := f.desired("web-2", "deploy"); d.BundleID != b {
		t.Fatalf("the offline host's desired state = %+v", d)
	}
	f.fleet.setOnline("web-2", true)
	f.agents["web-2"] = startSimAgent(t, f.ns, "web-2", f.key.trusted(), simInstall)
	waitUntil(t, "the returning host installs", func() bool {
		return rolloutInfo(t, f.s, id).Counts[protocol.SkillInstalled] == 2
	})
}

// More failures than max_errors pause the rollout; resume goes on past
// them; failures are not re-counted.
func TestRolloutFailuresPause(t *testing.T) {
	hosts := []string{"web-1", "web-2", "web-3", "web-4", "web-5"}
	f := newRolloutFixture(t, hosts, map[string]string{"web-2": simFail, "web-3": simFail})
	f.push("deploy", "1")
	id := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "*", Canary: intp(1), Batch: "2", MaxErrors: 1})
	in := f.waitState(id, protocol.RolloutPaused)
	if in.CurrentBatch != 1 || in.Counts[protocol.SkillFailed] != 2 || !strings.Contains(in.Reason, "max_errors 1") {
		t.Fatalf("paused as %+v", in)
	}
	if d := f.desired("web-4", "deploy"); d.BundleID != "" {
		t.Fatalf("a host of the next batch got the bundle: %+v", d)
	}
	if _, err := f.s.control(context.Background(), id, protocol.RolloutPause); err == nil {
		t.Fatal("pausing a paused rollout was accepted")
	}
	if _, err := f.s.control(context.Background(), id, protocol.RolloutResume); err != nil {
		t.Fatal(err)
	}
	in = f.waitState(id, protocol.RolloutDone)
	if in.Counts[protocol.SkillInstalled] != 3 || in.Counts[protocol.SkillFailed] != 2 {
		t.Fatalf("done with %v", in.Counts)
	}
}

// With auto_rollback, too many failures roll back: hosts that had a
// previous bundle get it back, hosts that had none have the skill
// removed.
func TestRolloutAutoRollback(t *testing.T) {
	hosts := []string{"web-1", "web-2", "web-3"}
	f := newRolloutFixture(t, hosts, nil)
	v1 := f.push("deploy", "1")
	first := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "web-1", Canary: intp(0), Batch: "1"})
	f.waitState(first, protocol.RolloutDone)
	v2 := f.push("deploy", "2")
	f.agents["web-3"].mu.Lock()
	f.agents["web-3"].behave = simFail
	f.agents["web-3"].mu.Unlock()
	id := f.start(protocol.RolloutRequest{Skill: "deploy", BundleID: v2, Selector: "*", Canary: intp(2), Batch: "1", AutoRollback: true})
	in := f.waitState(id, protocol.RolloutRolledBack)
	if !strings.Contains(in.Reason, "1 hosts failed") {
		t.Fatalf("rolled back as %+v", in)
	}
	waitUntil(t, "the rollback is written", func() bool {
		r, _ := f.s.rolloutByID(context.Background(), id)
		return !r.Undo
	})
	if d := f.desired("web-1", "deploy"); d.BundleID != v1 || d.Remove {
		t.Fatalf("web-1 (had v1) desired after rollback = %+v", d)
	}
	if d := f.desired("web-2", "deploy"); !d.Remove {
		t.Fatalf("web-2 (had nothing) desired after rollback = %+v", d)
	}
	waitUntil(t, "web-1 runs v1 again", func() bool {
		a := f.agents["web-1"]
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.active["deploy"] == v1
	})
	// The served bundle is no longer the rolled back one.
	if got, _, _ := f.s.ServedSkill(context.Background(), "deploy"); got.BundleID != v1 {
		t.Fatalf("served after rollback = %s, want v1", got.BundleID)
	}
}

// A host still installing after batch_timeout counts as failed.
func TestRolloutBatchTimeout(t *testing.T) {
	f := newRolloutFixture(t, []string{"web-1", "web-2"}, map[string]string{"web-2": simHang})
	f.push("deploy", "1")
	id := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "*", Canary: intp(0), Batch: "100%", BatchTimeout: "1s"})
	in := f.waitState(id, protocol.RolloutPaused)
	if len(in.Problems) != 1 || in.Problems[0].Host != "web-2" || !strings.Contains(in.Problems[0].Reason, "timed out") {
		t.Fatalf("problems = %+v", in.Problems)
	}
}

// Pause stops further batches; resume goes on; rollback undoes.
func TestRolloutPauseResumeRollback(t *testing.T) {
	hosts := []string{"web-1", "web-2", "web-3"}
	f := newRolloutFixture(t, hosts, nil)
	hold := make(chan struct{})
	f.agents["web-1"].setHold(hold)
	f.push("deploy", "1")
	ctx := context.Background()
	id := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "*", Canary: intp(1), Batch: "1"})
	waitUntil(t, "the canary's desired state", func() bool { return f.desired("web-1", "deploy").BundleID != "" })
	if _, err := f.s.control(ctx, id, protocol.RolloutPause); err != nil {
		t.Fatal(err)
	}
	close(hold)
	waitUntil(t, "the canary installs", func() bool {
		return rolloutInfo(t, f.s, id).Counts[protocol.SkillInstalled] == 1
	})
	time.Sleep(200 * time.Millisecond)
	if in := rolloutInfo(t, f.s, id); in.State != protocol.RolloutPaused || in.CurrentBatch != 0 {
		t.Fatalf("a paused rollout went on: %+v", in)
	}
	if _, err := f.s.control(ctx, id, protocol.RolloutResume); err != nil {
		t.Fatal(err)
	}
	f.waitState(id, protocol.RolloutDone)
	if _, err := f.s.control(ctx, id, "explode"); err == nil {
		t.Fatal("an unknown action was accepted")
	}
	if _, err := f.s.control(ctx, id, protocol.RolloutRollback); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "every host removes the skill", func() bool {
		for _, h := range hosts {
			if !f.desired(h, "deploy").Remove {
				return false
			}
		}
		return true
	})
	if _, err := f.s.control(ctx, id, protocol.RolloutRollback); err == nil {
		t.Fatal("a second rollback was accepted")
	}
}

// Two rollouts of different skills on overlapping hosts keep both in the
// hosts' desired states; a new rollout of the same skill supersedes the
// running one.
func TestRolloutsOverlapAndSupersede(t *testing.T) {
	hosts := []string{"web-1", "web-2", "web-3", "web-4"}
	f := newRolloutFixture(t, hosts, nil)
	f.fleet.hosts["web-4"]["role"] = "db"
	a := f.push("deploy", "1")
	b := f.push("backup", "1")
	ra := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "role=web", Canary: intp(0), Batch: "1"})
	rb := f.start(protocol.RolloutRequest{Skill: "backup", Selector: "*", Canary: intp(0), Batch: "1"})
	f.waitState(ra, protocol.RolloutDone)
	f.waitState(rb, protocol.RolloutDone)
	for _, h := range hosts[:3] {
		if f.desired(h, "deploy").BundleID != a || f.desired(h, "backup").BundleID != b {
			t.Fatalf("%s lost a skill", h)
		}
	}
	hold := make(chan struct{})
	f.agents["web-1"].setHold(hold)
	a2 := f.push("deploy", "2")
	old := f.start(protocol.RolloutRequest{Skill: "deploy", BundleID: a2, Selector: "*", Canary: intp(1), Batch: "1"})
	waitUntil(t, "the canary gets v2", func() bool { return f.desired("web-1", "deploy").BundleID == a2 })
	a3 := f.push("deploy", "3")
	f.agents["web-1"].setHold(nil)
	newer := f.start(protocol.RolloutRequest{Skill: "deploy", BundleID: a3, Selector: "*", Canary: intp(0), Batch: "100%"})
	close(hold)
	in := f.waitState(old, protocol.RolloutSuperseded)
	if !strings.Contains(in.Reason, newer) {
		t.Fatalf("superseded as %+v", in)
	}
	f.waitState(newer, protocol.RolloutDone)
	for _, h := range hosts {
		if f.desired(h, "deploy").BundleID != a3 {
			t.Fatalf("%s desired %+v", h, f.desired(h, "deploy"))
		}
	}
}

// Two gateways: one leads; when it stops mid-rollout, the other takes
// the leader key once it expires and finishes the rollout from the
// record. The host of the batch in flight never heard the dead leader's
// poke (it was deaf to it, as when the leader dies between the write and
// the poke): the new leader pokes it again.
func TestRolloutLeaderFailover(t *testing.T) {
	hosts := []string{"web-1", "web-2", "web-3", "web-4"}
	f := newRolloutFixture(t, hosts, nil)
	other := testSkills(t, f.ns, f.fleet, f.key, "b")
	if other.ctl.leader() {
		t.Fatal("two leaders")
	}
	f.agents["web-2"].deaf.Store(true)
	f.push("deploy", "1")
	id := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "*", Canary: intp(1), Batch: "1"})
	waitUntil(t, "the second batch is written", func() bool { return f.desired("web-2", "deploy").BundleID != "" })
	// The leader dies without resigning: its connection goes first.
	f.s.nc.Close()
	f.s.Close()
	f.agents["web-2"].deaf.Store(false)
	waitUntil(t, "the other gateway leads", other.ctl.leader)
	in := protocol.RolloutInfo{}
	defer func() {
		if t.Failed() {
			t.Logf("last seen: %+v", in)
		}
	}()
	waitUntil(t, "the rollout finishes under the new leader", func() bool {
		in = rolloutInfo(t, other, id)
		return in.State == protocol.RolloutDone
	})
	if in.Counts[protocol.SkillInstalled] != 4 {
		t.Fatalf("done with %v", in.Counts)
	}
}

// What a gateway uses of JetStream does not grow with the hosts: one
// ordered consumer on the status stream, none on the desired states
// (agents read them by direct get).
func TestRolloutConsumersDoNotGrow(t *testing.T) {
	var hosts []string
	for i := range 40 {
		hosts = append(hosts, fmt.Sprintf("web-%02d", i))
	}
	f := newRolloutFixture(t, hosts, nil)
	f.push("deploy", "1")
	id := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "*", Canary: intp(1), Batch: "50%"})
	f.waitState(id, protocol.RolloutDone)
	js, err := jetstream.New(f.s.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	consumers := func(stream string) int {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	if n := consumers(protocol.SkillsStatusStream); n != 1 {
		t.Fatalf("status stream has %d consumers for 40 hosts, want 1", n)
	}
	if n := consumers("KV_" + protocol.SkillsDesiredBucket); n != 0 {
		t.Fatalf("desired-state bucket has %d consumers, want 0", n)
	}
	waitUntil(t, "object store reads end", func() bool { return consumers("OBJ_"+skillFilesBucket) == 0 })
	_, loads := f.s.cache.stats()
	if loads > 2 {
		t.Fatalf("40 hosts fetching 2 files read the object store %d times", loads)
	}
}

// A desired-state write that finds nothing to change still pokes its
// host: the write may have landed on an earlier attempt whose answer was
// lost, and the host must hear of it.
func TestDesiredWritePokesWhenAlreadyDone(t *testing.T) {
	ns := startJetStream(t)
	s := testSkills(t, ns, newFakeFleet("web-1"), testSigningKey(t), "a")
	sub, err := connectNATS(t, ns, "agent").SubscribeSync(protocol.SkillsPokeSubject("web-1"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	want := protocol.DesiredSkill{BundleID: "sha256:" + strings.Repeat("a", 64), Rollout: "r-1"}
	set := func(skills map[string]protocol.DesiredSkill) bool {
		if skills["deploy"] == want {
			return false
		}
		skills["deploy"] = want
		return true
	}
	for range 2 {
		if _, err := s.setDesired(ctx, "web-1", set); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.NextMsg(waitFor); err != nil {
			t.Fatalf("no poke: %v", err)
		}
	}
	d, rev, err := s.readDesired(ctx, "web-1")
	if err != nil || rev != 1 || d.Revision != 1 {
		t.Fatalf("after a write and a no-op: %+v at %d, %v", d, rev, err)
	}
}

// A replica whose renewal landed but whose answer was lost holds the key
// at a revision it did not learn: it finds the key is still its own and
// keeps leading, rather than stalling until the key expires.
func TestLeaderKeepsKeyAfterLostAnswer(t *testing.T) {
	ns := startJetStream(t)
	s := testSkills(t, ns, newFakeFleet("web-1"), testSigningKey(t), "a")
	waitUntil(t, "the service leads", s.ctl.leader)
	// Another write of the same value: what a renewal whose answer was
	// lost leaves behind.
	s.ctl.mu.Lock()
	rev := s.ctl.rev
	s.ctl.mu.Unlock()
	if _, err := s.leader.Update(context.Background(), leaderKey, []byte("a"), rev); err != nil {
		t.Fatal(err)
	}
	s.ctl.campaign(context.Background())
	if !s.ctl.leader() {
		t.Fatal("lost the lead to its own key")
	}
	s.ctl.mu.Lock()
	got := s.ctl.rev
	s.ctl.mu.Unlock()
	if got != rev+1 {
		t.Fatalf("holds revision %d, the key is at %d", got, rev+1)
	}
	s.ctl.campaign(context.Background())
	if !s.ctl.leader() {
		t.Fatal("the next renewal failed")
	}
}

func TestParseBatch(t *testing.T) {
	for _, tt := range []struct {
		batch string
		n     int
		want  int
	}{{"10", 100, 10}, {"25%", 10, 3}, {"1%", 10, 1}, {"100%", 7, 7}, {"0", 5, 0}, {"101%", 5, 0}, {"x", 5, 0}, {"-1", 5, 0}, {"%", 5, 0}} {
		got, err := parseBatch(tt.batch, tt.n)
		if tt.want == 0 && err == nil || tt.want != 0 && (err != nil || got != tt.want) {
			t.Errorf("parseBatch(%q, %d) = %d, %v; want %d", tt.batch, tt.n, got, err, tt.want)
		}
	}
}

func FuzzParseBatch(f *testing.F) {
	for _, s := range []string{"10", "25%", "100%", "0%", "1e3", " 5"} {
		f.Add(s, 100)
	}
	f.Fuzz(func(t *testing.T, batch string, n int) {
		if n < 1 || n > 100000 {
			return
		}
		size, err := parseBatch(batch, n)
		if err == nil && size < 1 {
			t.Fatalf("parseBatch(%q, %d) = %d", batch, n, size)
		}
	})
}

// After a rollback, each host's state is measured against the bundle it
// had before, and shows within seconds: installed again, removed where it
// had none, skipped where its batch never started.
func TestRolloutRollbackShowsHostStates(t *testing.T) {
	hosts := []string{"web-1", "web-2", "web-3", "web-4"}
	f := newRolloutFixture(t, hosts, nil)
	v1 := f.push("deploy", "1")
	f.waitState(f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "web-1", Canary: intp(0), Batch: "1"}), protocol.RolloutDone)
	v2 := f.push("deploy", "2")
	f.agents["web-3"].mu.Lock()
	f.agents["web-3"].behave = simFail
	f.agents["web-3"].mu.Unlock()
	id := f.start(protocol.RolloutRequest{Skill: "deploy", BundleID: v2, Selector: "*", Canary: intp(2), Batch: "1", AutoRollback: true})
	f.waitState(id, protocol.RolloutRolledBack)
	want := map[string]string{"web-1": protocol.SkillInstalled, "web-2": protocol.SkillRemoved, "web-3": protocol.SkillRemoved, "web-4": protocol.RolloutHostSkipped}
	deadline := time.Now().Add(5 * time.Second)
	var in protocol.RolloutInfo
	waitUntil(t, "every host's state after the rollback", func() bool {
		in = rolloutInfo(t, f.s, id)
		for _, h := range in.HostStates {
			if want[h.Host] != h.State {
				return false
			}
		}
		return len(in.HostStates) == len(hosts)
	})
	if time.Now().After(deadline) {
		t.Fatalf("the hosts' states took more than 5s to show: %+v", in.HostStates)
	}
	for _, h := range in.HostStates {
		if h.Host == "web-1" && h.Active != v1 {
			t.Fatalf("web-1 serves %s after the rollback, want %s", h.Active, v1)
		}
	}
	if in.Counts[protocol.SkillPending] != 0 || in.Counts[protocol.SkillInstalled] != 1 || in.Counts[protocol.SkillRemoved] != 2 {
		t.Fatalf("counts after the rollback = %v", in.Counts)
	}
}
