package enrol

import (
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The host of a renewal subject is its one valid host name, or none.
func TestRenewHost(t *testing.T) {
	if h, ok := renewHost(protocol.RenewSubject("web-1")); !ok || h != "web-1" {
		t.Errorf("renewHost = %q %v", h, ok)
	}
	for _, s := range []string{"fleet.v1.agent.renew", "fleet.v1.agent.a.b.renew", "fleet.v1.host.web-1.renew", "fleet.v1.agent.web-1.call"} {
		if h, ok := renewHost(s); ok {
			t.Errorf("renewHost(%q) = %q", s, h)
		}
	}
}
