package skills

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// longHosts returns n host names of the longest length, sorted.
func longHosts(n int) []string {
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("host-%05d-", i) + strings.Repeat("x", protocol.MaxHostLen-11)
	}
	return hosts
}

// A rollout to 10,000 hosts of the longest names, every one of which
// fails (here: none installs before the batch timeout), keeps its
// record one NATS message: the failures are counted by index, and the
// reasons of only the first ones are kept, clipped; every host still
// shows failed, with a reason.
func TestRolloutRecordBoundedWhenAllFail(t *testing.T) {
	if testing.Short() {
		t.Skip("writes the desired state of 10,000 hosts")
	}
	hosts := longHosts(10000)
	f := &rolloutFixture{t: t, ns: startJetStream(t), key: testSigningKey(t), fleet: newFakeFleet(hosts...), agents: map[string]*simAgent{}}
	f.s = testSkills(t, f.ns, f.fleet, f.key, "a")
	waitUntil(t, "the service leads", f.s.ctl.leader)
	f.push("deploy", "1")
	id := f.start(protocol.RolloutRequest{Skill: "deploy", Selector: "*", Canary: intp(0), Batch: "100%", BatchTimeout: "1s", MaxErrors: 5})
	in := waitRolloutState(t, f.s, id, protocol.RolloutPaused)
	if in.Counts[protocol.SkillFailed] != len(hosts) || !strings.Contains(in.Reason, "10000 hosts failed") {
		t.Fatalf("paused with %v: %s", in.Counts, in.Reason)
	}
	e, err := f.s.rolls.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(e.Value()); n > maxRolloutRecord {
		t.Fatalf("the record of 10,000 failed hosts is %d bytes, over %d", n, maxRolloutRecord)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(e.Value(), &raw); err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["failed"]; ok {
		t.Error("the record names its failed hosts again")
	}
	r, err := decodeRollout(id, e.Value())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.FailedHosts) != len(hosts) || len(r.Reasons) != maxRolloutReasons || r.errors() != len(hosts) {
		t.Fatalf("%d failed hosts, %d reasons, %d errors", len(r.FailedHosts), len(r.Reasons), r.errors())
	}
	for _, p := range in.Problems {
		if p.State != protocol.SkillFailed || p.Reason == "" {
			t.Fatalf("problem %+v", p)
		}
	}
	first, _ := f.s.hostState(r, r.FailedHosts[0])
	_, firstWhy := f.s.hostState(r, r.FailedHosts[0])
	_, lastWhy := f.s.hostState(r, r.FailedHosts[len(hosts)-1])
	if first != protocol.SkillFailed || !strings.Contains(firstWhy, "timed out") || !strings.Contains(lastWhy, "keeps the reasons of its first 100") {
		t.Errorf("first failed host: %s %q; last: %q", first, firstWhy, lastWhy)
	}
	// Resumed, the failures are accepted: none counts any more.
	if _, err := f.s.control(context.Background(), id, protocol.RolloutResume); err != nil {
		t.Fatal(err)
	}
	in = waitRolloutState(t, f.s, id, protocol.RolloutDone)
	if in.Counts[protocol.SkillFailed] != len(hosts) {
		t.Errorf("done with %v", in.Counts)
	}
}

// waitRolloutState waits up to two minutes (10,000 desired states are
// written first) until rollout id is in state, and returns its info.
func waitRolloutState(t *testing.T, s *Store, id, state string) protocol.RolloutInfo {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		r, err := s.rolloutByID(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if r.State == state {
			return s.info(r, false)
		}
		if time.Now().After(deadline) {
			t.Fatalf("rollout %s is %s after 2 min, want %s", id, r.State, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A rollout is refused at the start when its record could outgrow one
// message as it runs; 10,000 hosts of the longest names fit.
func TestRolloutRecordRoomAtStart(t *testing.T) {
	f := &rolloutFixture{t: t, ns: startJetStream(t), key: testSigningKey(t), fleet: newFakeFleet(longHosts(12000)...), agents: map[string]*simAgent{}}
	f.s = testSkills(t, f.ns, f.fleet, f.key, "a")
	f.push("deploy", "1")
	_, err := f.s.startRollout(context.Background(), protocol.RolloutRequest{Skill: "deploy", Selector: "*"}, false, "test")
	if err == nil || !strings.Contains(err.Error(), "do not fit one record") {
		t.Fatalf("a rollout to 12,000 long names: %v", err)
	}
	r, err := f.s.newRollout(protocol.RolloutRequest{Skill: "deploy", Selector: "*"}, false, "test")
	if err != nil {
		t.Fatal(err)
	}
	r.Hosts = r.Hosts[:10000]
	data, _ := json.Marshal(r)
	if len(data)+rolloutGrowth(len(r.Hosts)) > maxRolloutRecord {
		t.Errorf("10,000 long names need %d bytes with growth, over %d", len(data)+rolloutGrowth(len(r.Hosts)), maxRolloutRecord)
	}
}

// Failures are kept once per host, their reasons clipped and only the
// first ones kept; a record of an earlier gateway, which named its failed
// hosts, reads as the same failures.
func TestRolloutFailureRecord(t *testing.T) {
	r := &rollout{ID: "r1", Hosts: longHosts(300)}
	r.fail(3, strings.Repeat("why ", 1000))
	r.fail(3, "again")
	r.fail(-1, "out of range")
	r.fail(300, "out of range")
	for i := range 300 {
		r.fail(i, "failed")
	}
	if len(r.FailedHosts) != 300 || r.FailedHosts[0] != 3 || len(r.Reasons) != maxRolloutReasons || len(r.Reasons[r.Hosts[3]]) > maxRolloutReason+8 {
		t.Fatalf("%d failed, first %d, %d reasons, first reason %d bytes", len(r.FailedHosts), r.FailedHosts[0], len(r.Reasons), len(r.Reasons[r.Hosts[3]]))
	}
	old, _ := json.Marshal(map[string]any{"id": "r2", "hosts": []string{"a", "b", "c"}, "failed": map[string]string{"c": "broke", "a": "timed out", "zz": "gone"}, "acked": 1})
	o, err := decodeRollout("r2", old)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Failed) != 0 || len(o.FailedHosts) != 2 || !o.isFailed(0) || !o.isFailed(2) || o.isFailed(1) || o.Reasons["c"] != "broke" || o.errors() != 1 {
		t.Fatalf("an earlier record reads as %+v", o)
	}
	again, _ := json.Marshal(o)
	if strings.Contains(string(again), `"failed":`) {
		t.Errorf("written again, it names its failed hosts: %s", again)
	}
}
