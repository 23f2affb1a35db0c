package protocol

import "testing"

// No subject an agent may publish to, or subscribe to, reaches the audit
// trail.
func TestAuditSubjectOutsideAgentReach(t *testing.T) {
	if got, want := AuditSubject(), "fleet.v1.audit"; got != want {
		t.Fatalf("AuditSubject() = %q, want %q", got, want)
	}
	for _, w := range []string{AllHosts(), AllPresence(), PresenceWildcard(), DiscoverSubject(), HostSubjects("web-1")} {
		if matches(w, AuditSubject()) {
			t.Errorf("agent subject %q covers the audit subject %q", w, AuditSubject())
		}
	}
}
