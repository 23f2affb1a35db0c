package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// The audit trail blanks this gateway's API tokens wherever they show in
// a call's arguments.
func TestAuditRedactsAPITokens(t *testing.T) {
	token, _, err := access.NewAPIToken("deploy")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]string{"command": "curl -d " + token + " https://example.com"})
	got, _ := audit.ArgsSummary(raw)["command"].(string)
	if strings.Contains(got, token[len(access.APITokenPrefix):]) || !strings.Contains(got, "[redacted]") {
		t.Errorf("summary %q keeps the API token", got)
	}
}

// The trail's seals are the record seal's audit kinds, as records were
// always sealed: a chained record's seal is not an unchained one's, nor
// another call's, nor another fleet's.
func TestAuditSeal(t *testing.T) {
	seal := func() auditSeal {
		kp, _ := nkeys.CreateAccount()
		s, err := newRecordSeal(kp)
		if err != nil {
			t.Fatal(err)
		}
		return auditSeal{s}
	}
	a, other := seal(), seal()
	data := []byte(`{"call_id":"c1"}`)
	chained := a.Mark(true, "c1", data)
	if chained != a.s.mark(sealAuditChained, "c1", data) || a.Mark(false, "c1", data) != a.s.mark(sealAudit, "c1", data) {
		t.Fatal("the audit seals are not the record seal's audit kinds")
	}
	switch {
	case !a.Holds(true, "c1", data, chained):
		t.Error("a chained record's seal does not hold")
	case a.Holds(false, "c1", data, chained):
		t.Error("a chained record's seal holds for an unchained record")
	case a.Holds(true, "c2", data, chained):
		t.Error("a record's seal holds for another call's")
	case other.Holds(true, "c1", data, chained):
		t.Error("a record's seal holds in another fleet")
	}
}
