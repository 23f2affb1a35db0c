package gateway

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// GET AdminAuditPath answers the audit tool's query with its filters as
// query parameters, and refuses filters it does not know.
func TestAdminAuditQuery(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{Name: "web-1"})
	c.createToken(protocol.TokenCreateRequest{Name: "web-2"})
	var all protocol.AuditAnswer
	waitUntil(t, "both token creations in the trail", func() bool {
		all = protocol.AuditAnswer{}
		status, aerr := c.do(http.MethodGet, protocol.AdminAuditPath+"?tool=admin_token_create", nil, &all)
		return status == http.StatusOK && aerr == nil && len(all.Records) == 2
	})
	if r := all.Records[0]; r.Tool != "admin_token_create" || r.Target != tok.Info.ID || r.Decision != "allowed" || r.Outcome != "ok" {
		t.Errorf("first record %+v", r)
	}
	var one protocol.AuditAnswer
	if status, aerr := c.do(http.MethodGet, protocol.AdminAuditPath+"?"+url.Values{"tool": {"admin_token_create"}, "limit": {"1"}, "since": {"1h"}}.Encode(), nil, &one); status != http.StatusOK || aerr != nil {
		t.Fatalf("limit 1: %d %+v", status, aerr)
	}
	if len(one.Records) != 1 || one.Records[0].Target == tok.Info.ID {
		t.Errorf("limit 1 gave %+v; want the newest record only", one.Records)
	}
	for q, want := range map[string]string{
		"?colour=red":        `no audit filter "colour"`,
		"?limit=many":        "limit",
		"?decision=maybe":    "allowed or denied",
		"?since=yesterday":   "RFC 3339",
		"?since=1h&until=2h": "not before",
	} {
		status, aerr := c.do(http.MethodGet, protocol.AdminAuditPath+q, nil, nil)
		if status != http.StatusBadRequest || aerr == nil || !strings.Contains(aerr.Message, want) {
			t.Errorf("%s: %d %+v; want 400 saying %q", q, status, aerr, want)
		}
	}
	if status, _ := c.do(http.MethodPost, protocol.AdminAuditPath, nil, nil); status != http.StatusMethodNotAllowed {
		t.Errorf("POST audit: %d", status)
	}
}
