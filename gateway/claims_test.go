package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// step is one announce of an agent process in a claims scenario, after
// the clock moved by after.
type step struct {
	after    time.Duration
	instance string
	agent    string // the installation's AgentID
	leaving  bool
}

// TestRegistryClaims: a restarted agent (a new process of the same
// installation) takes its host over at once; another installation
// announcing a live host is a conflict until one of them goes; a copied
// state directory (one installation, two live processes) is a conflict
// once the replaced process is heard again more than a heartbeat (5 s
// here) after it was replaced; before that, what comes from it is a
// message it sent before it died, and is ignored.
func TestRegistryClaims(t *testing.T) {
	tests := []struct {
		name     string
		steps    []step
		conflict []string // the instances the conflict names; nil: none
		online   bool
		facts    string // the instance whose facts are shown; empty: not checked
	}{
		{"restart takes over at once", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "p2", "agent-a", false},
		}, nil, true, "p2"},
		{"a late message from the replaced process is ignored", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "p2", "agent-a", false},
			{100 * time.Millisecond, "p1", "agent-a", false},
			{4 * time.Second, "p1", "agent-a", false},
		}, nil, true, "p2"},
		{"restart after restart", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "p2", "agent-a", false},
			{time.Second, "p3", "agent-a", false},
			{time.Second, "p3", "agent-a", false},
		}, nil, true, ""},
		{"replaced process heard a heartbeat later: a copied state directory", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "p2", "agent-a", false},
			{3 * time.Second, "p1", "agent-a", false},
			{3 * time.Second, "p1", "agent-a", false},
		}, []string{"p1", "p2"}, true, ""},
		{"copies keep conflicting as both heartbeat", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "p2", "agent-a", false},
			{6 * time.Second, "p1", "agent-a", false},
			{time.Second, "p2", "agent-a", false},
			{5 * time.Second, "p1", "agent-a", false},
			{time.Second, "p2", "agent-a", false},
		}, []string{"p1", "p2"}, true, ""},
		{"another installation is a second machine", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "q1", "agent-b", false},
		}, []string{"p1", "q1"}, true, ""},
		{"another installation restarting does not take over the first", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "q1", "agent-b", false},
			{time.Second, "q2", "agent-b", false},
		}, []string{"p1", "q2"}, true, ""},
		{"old agents without an ID: a new process is a conflict", []step{
			{0, "p1", "", false},
			{time.Second, "p2", "", false},
		}, []string{"p1", "p2"}, true, ""},
		{"an agent without an ID cannot take over one with", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "p2", "", false},
		}, []string{"p1", "p2"}, true, ""},
		{"an oversized ID takes nothing over", []step{
			{0, "p1", strings.Repeat("a", protocol.MaxAgentIDLen+1), false},
			{time.Second, "p2", strings.Repeat("a", protocol.MaxAgentIDLen+1), false},
		}, []string{"p1", "p2"}, true, ""},
		{"the replaced process's goodbye leaves the new one online", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "p2", "agent-a", false},
			{time.Second, "p1", "agent-a", true},
		}, nil, true, ""},
		{"the new process's goodbye: offline", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "p2", "agent-a", false},
			{time.Second, "p2", "agent-a", true},
		}, nil, false, ""},
		{"a second machine leaves: no conflict", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "q1", "agent-b", false},
			{time.Second, "q1", "agent-b", true},
		}, nil, true, ""},
		{"a second machine stops heartbeating: the conflict expires", []step{
			{0, "p1", "agent-a", false},
			{time.Second, "q1", "agent-b", false},
			{15 * time.Second, "p1", "agent-a", false},
			{time.Second, "p1", "agent-a", false},
		}, nil, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, clock := newTestRegistry()
			for _, s := range tc.steps {
				clock.advance(s.after)
				a := announceOf("web-1")
				a.Instance, a.AgentID, a.Leaving = s.instance, s.agent, s.leaving
				announce(t, r, a)
			}
			h, ok := r.get("web-1")
			if !ok {
				t.Fatal("web-1 is not in the registry")
			}
			if h.Online != tc.online {
				t.Errorf("online = %v, want %v", h.Online, tc.online)
			}
			want := ""
			if tc.conflict != nil {
				want = "agent instances " + strings.Join(tc.conflict, ", ") + " all announce this name"
			}
			if h.Conflict != want {
				t.Errorf("conflict = %q, want %q", h.Conflict, want)
			}
			if tc.facts != "" && h.Instance != tc.facts {
				t.Errorf("the host shows the facts of instance %q, want %q", h.Instance, tc.facts)
			}
		})
	}
}
