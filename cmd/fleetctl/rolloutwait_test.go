package main

import (
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// script makes the fake gateway answer rollout id with infos, one per
// request.
func (g *fakeGateway) script(id string, infos ...*protocol.RolloutInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.skills.script == nil {
		g.skills.script = map[string][]*protocol.RolloutInfo{}
	}
	g.skills.script[id] = infos
}

func rolloutAt(id, state string, batch int, counts map[string]int) *protocol.RolloutInfo {
	return &protocol.RolloutInfo{ID: id, Skill: "deploy", State: state, Hosts: 3, Batches: 2, CurrentBatch: batch, Counts: counts}
}

// skills rollout --wait follows the rollout, a line per change, and
// exits 0 when it is done; a rollout that pauses or is rolled back exits
// 1 and says why, with the hosts that failed.
func TestRolloutWait(t *testing.T) {
	g := startFakeGateway(t)
	id := "r-bbbbbbbbbb"
	g.script(id,
		rolloutAt(id, protocol.RolloutRunning, 0, map[string]int{protocol.SkillPending: 1, protocol.RolloutHostWaiting: 2}),
		rolloutAt(id, protocol.RolloutRunning, 0, map[string]int{protocol.SkillPending: 1, protocol.RolloutHostWaiting: 2}),
		rolloutAt(id, protocol.RolloutRunning, 1, map[string]int{protocol.SkillInstalled: 1, protocol.SkillInstalling: 2}),
		rolloutAt(id, protocol.RolloutDone, 1, map[string]int{protocol.SkillInstalled: 3}))
	r := mustRun(t, adminEnv(g), "skills", "rollout", "deploy", "--selector", "role=web", "--wait", "--poll", "100ms")
	contains(t, "rollout --wait", r.stdout, "Rollout r-bbbbbbbbbb started", "running, batch 1 of 2; hosts: 1 pending, 2 waiting",
		"running, batch 2 of 2; hosts: 1 installed, 2 installing", "done, all 2 batches; hosts: 3 installed")
	if n := strings.Count(r.stdout, "batch 1 of 2"); n != 1 {
		t.Errorf("an unchanged rollout was printed %d times:\n%s", n, r.stdout)
	}
	if strings.Contains(r.stdout, "Follow it with") {
		t.Errorf("--wait still says how to follow:\n%s", r.stdout)
	}

	paused := rolloutAt(id, protocol.RolloutPaused, 0, map[string]int{protocol.SkillFailed: 1, protocol.RolloutHostWaiting: 2})
	paused.Reason = "paused: 1 hosts failed, more than max_errors 0; resume to go on, or roll back"
	paused.Problems = []protocol.RolloutHost{{Host: "web-1", State: protocol.SkillFailed, Reason: "mkdir: permission denied"}}
	g.script(id, rolloutAt(id, protocol.RolloutRunning, 0, nil), paused)
	r = fleetctl(t, adminEnv(g), "skills", "rollout", "deploy", "--selector", "role=web", "--wait", "--poll", "100ms")
	if r.code != 1 {
		t.Fatalf("a paused rollout: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	contains(t, "paused rollout's stderr", r.stderr, "rollout r-bbbbbbbbbb ended paused", "more than max_errors 0", "resume or rollback")
	contains(t, "paused rollout's stdout", r.stdout, "web-1: failed: mkdir: permission denied")

	// status --wait of a rollout that ended already answers at once.
	r = fleetctl(t, adminEnv(g), "skills", "status", "r-aaaaaaaaaa", "--wait")
	if r.code != 1 || !strings.Contains(r.stderr, "ended paused") {
		t.Errorf("status --wait of a paused rollout: exit %d\n%s", r.code, r.stderr)
	}
	if r := fleetctl(t, adminEnv(g), "skills", "status", "r-aaaaaaaaaa", "--wait", "--poll", "1ms"); r.code != 2 || !strings.Contains(r.stderr, "--poll") {
		t.Errorf("--poll 1ms: exit %d\n%s", r.code, r.stderr)
	}
}
