package main

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// audit answers the trail's query with two records.
func (g *fakeGateway) audit(w http.ResponseWriter, r *http.Request) {
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	exit := 2
	ans := protocol.AuditAnswer{Scanned: 40, Records: []protocol.AuditEntry{
		{Time: at, Tool: "bash", Hosts: []string{"web-1"}, Decision: "allowed", Outcome: "error", ExitCode: &exit, Error: "make: *** no rule", DurationMS: 1500},
		{Time: at.Add(time.Minute), Tool: "write", Hosts: []string{"web-2"}, Decision: "denied", Outcome: "refused", Reason: "no rule allows write"},
	}}
	ans.Records[0].Caller.Kind, ans.Records[0].Caller.Subject = "api_token", "ci"
	ans.Records[1].Caller.Kind, ans.Records[1].Caller.Subject, ans.Records[1].Caller.Email = "oidc", "u1", "alice@example.com"
	g.answer(w, http.StatusOK, &ans)
}

// fleetctl audit sends its filters as the query and prints a table.
func TestAudit(t *testing.T) {
	g := startFakeGateway(t)
	r := mustRun(t, adminEnv(g), "audit", "--host", "web-1", "--since", "2h", "--decision", "denied", "--caller", "token ci", "--limit", "10")
	got := g.last()
	checkRequest(t, got, "GET", protocol.AdminAuditPath)
	q, _ := url.ParseQuery(got.Query)
	want := url.Values{"host": {"web-1"}, "since": {"2h"}, "decision": {"denied"}, "caller": {"token ci"}, "limit": {"10"}}
	if q.Encode() != want.Encode() {
		t.Errorf("query %q; want %q", q.Encode(), want.Encode())
	}
	for _, re := range []string{
		`(?m)^TIME +CALLER +TOOL +WHERE +DECISION +OUTCOME +DURATION +DETAIL$`,
		`(?m)^2026-12-01T09:00:00Z +token ci +bash +web-1 +allowed +error \(exit 2\) +1\.5s +make: \*\*\* no rule$`,
		`(?m)^2026-12-01T09:01:00Z +alice@example\.com +write +web-2 +denied +refused +0s +no rule allows write$`,
		`2 records \(40 searched\)`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("audit output does not match %s:\n%s", re, r.stdout)
		}
	}
	for _, bad := range [][]string{{"audit", "--limit", "0"}, {"audit", "web-1"}} {
		if r := fleetctl(t, adminEnv(g), bad...); r.code != 2 {
			t.Errorf("fleetctl %s: exit %d\n%s", strings.Join(bad, " "), r.code, r.stderr)
		}
	}
}
