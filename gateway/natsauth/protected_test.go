package natsauth

import (
	"testing"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
	"github.com/fleetmcp/fleetmcp/protocol"
)

func TestDeniesSubject(t *testing.T) {
	deny := runtimeDenied()
	for _, tc := range []struct {
		deny []string
		subj string
		want bool
	}{
		{deny, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", true},
		{deny, "$JS.API.STREAM.RESTORE.KV_" + protocol.AgentsBucket, true},
		{deny, "$JS.API.STREAM.UPDATE.KV_fleet_hosts", false},
		{deny, "$JS.hub.API.STREAM.DELETE.KV_fleet_tokens", true},
		{deny, "$JS.hub.API.STREAM.DELETE." + protocol.AuditStream, true},
		{nil, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", false},
		{[]string{"$JS.API.>"}, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", true},
		{[]string{"$JS.API.STREAM.*.KV_fleet_tokens"}, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", true},
		{[]string{"$JS.API.STREAM.*"}, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", false},
		{[]string{"$JS.API.STREAM.UPDATE.KV_fleet_tokens.x"}, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", false},
	} {
		if got := jskv.DeniesSubject(tc.deny, tc.subj); got != tc.want {
			t.Errorf("jskv.DeniesSubject(%v, %q) = %v, want %v", tc.deny, tc.subj, got, tc.want)
		}
	}
}
