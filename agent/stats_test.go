//go:build unix

package agent

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Announces carry the agent's counters: served, failed and refused calls
// move as calls happen, and the process's memory is reported.
func TestAnnounceCarriesStats(t *testing.T) {
	const host = "st-1"
	ns, nc, pres := watchedNATS(t)
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, []byte("tools: {deny: [write]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runAgent(t, ns, Config{Name: host, Cwd: t.TempDir(), PolicyFile: file})
	first := nextAnnounce(t, pres, host, false)
	if first.Stats == nil || first.Stats.CallsServed != 0 || first.Stats.RSSBytes <= 0 {
		t.Fatalf("first announce stats %+v", first.Stats)
	}
	if res, _ := sendCall(t, nc, newCall(host, "ok-1", "bash", map[string]string{"command": "true"})).result(t, "ok-1"); res.IsError {
		t.Fatalf("bash true: %+v", res)
	}
	sendCall(t, nc, newCall(host, "bad-1", "bash", map[string]string{"command": "exit 2"})).result(t, "bad-1")
	res, _ := sendCall(t, nc, newCall(host, "w-1", "write", map[string]string{"path": "x", "content": "x"})).result(t, "w-1")
	wantCode(t, res, protocol.CodeDenied, "tool write")
	want := protocol.AgentStats{CallsServed: 2, CallsFailed: 1, CallsRefused: 1}
	for range 40 { // a heartbeat every 5 s at most, the calls done at once
		a := nextAnnounce(t, pres, host, false)
		s := a.Stats
		if s.CallsServed == want.CallsServed && s.CallsFailed == want.CallsFailed && s.CallsRefused == want.CallsRefused {
			if s.Queued != 0 || s.Tasks != 0 || s.RSSBytes <= 0 {
				t.Errorf("stats %+v", *s)
			}
			return
		}
	}
	t.Fatalf("no announce with the stats %+v", want)
}
