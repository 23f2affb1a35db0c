package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/access"
)

func TestParseAuditQuery(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	good := []struct {
		in           auditIn
		limit        int
		since, until time.Time
	}{
		{auditIn{}, defaultAuditLimit, time.Time{}, time.Time{}},
		{auditIn{Limit: 5000}, maxAuditLimit, time.Time{}, time.Time{}},
		{auditIn{Since: "2h"}, defaultAuditLimit, now.Add(-2 * time.Hour), time.Time{}},
		{auditIn{Since: "2026-04-30T00:00:00Z", Until: "1h"}, defaultAuditLimit, time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC), now.Add(-time.Hour)},
	}
	for _, tc := range good {
		q, err := parseAuditQuery(tc.in, now)
		if err != nil || q.limit != tc.limit || !q.since.Equal(tc.since) || !q.until.Equal(tc.until) {
			t.Errorf("parseAuditQuery(%+v) = %+v, %v", tc.in, q, err)
		}
	}
	bad := []struct {
		in   auditIn
		want string
	}{
		{auditIn{Decision: "maybe"}, "allowed or denied"},
		{auditIn{Limit: -1}, "limit -1"},
		{auditIn{Since: "yesterday"}, `since: "yesterday" is neither`},
		{auditIn{Until: "-5m"}, "until:"},
		{auditIn{Since: "1h", Until: "2h"}, "is not before until"},
	}
	for _, tc := range bad {
		if _, err := parseAuditQuery(tc.in, now); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseAuditQuery(%+v) = %v, want an error mentioning %q", tc.in, err, tc.want)
		}
	}
}

func TestAuditQueryMatch(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	r := &AuditRecord{Time: at, Tool: "bash", Hosts: []string{"web-1"}, Decision: decisionDenied,
		Caller: AuditCaller{Subject: "u-1", Email: "Ada@Example.com", ClientID: "claude-code"}}
	tests := []struct {
		q    auditQuery
		want bool
	}{
		{auditQuery{}, true},
		{auditQuery{caller: "ada@"}, true},
		{auditQuery{caller: "claude"}, true},
		{auditQuery{caller: "bob"}, false},
		{auditQuery{host: "web-1", tool: "bash", decision: decisionDenied}, true},
		{auditQuery{host: "web-2"}, false},
		{auditQuery{decision: decisionAllowed}, false},
		{auditQuery{since: at}, true},
		{auditQuery{since: at.Add(time.Second)}, false},
		{auditQuery{until: at}, false},
		{auditQuery{until: at.Add(time.Second)}, true},
	}
	for _, tc := range tests {
		if got := tc.q.match(r); got != tc.want {
			t.Errorf("%+v matches = %v, want %v", tc.q, got, tc.want)
		}
	}
	// "token deploy" finds the API token deploy, not a provider's user
	// named like it; "deploy" finds both.
	tok := &AuditRecord{Time: at, Caller: AuditCaller{Kind: access.KindAPIToken, Subject: "deploy"}}
	usr := &AuditRecord{Time: at, Caller: AuditCaller{Kind: access.KindOIDC, Subject: "deploy"}}
	for _, tc := range []struct {
		q        string
		tok, usr bool
	}{{"token deploy", true, false}, {"deploy", true, true}} {
		q := auditQuery{caller: tc.q}
		if q.match(tok) != tc.tok || q.match(usr) != tc.usr {
			t.Errorf("caller %q: token %v, user %v; want %v, %v", tc.q, q.match(tok), q.match(usr), tc.tok, tc.usr)
		}
	}
}

// An audit row keeps its columns in place whether the call went to hosts,
// to a target, to both or to neither.
func TestAuditLineColumns(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	base := AuditRecord{Time: at, Caller: AuditCaller{Subject: "ops"}, Tool: "bash", Decision: decisionAllowed, Outcome: outcomeOK, DurationMS: 12}
	cases := []struct {
		name  string
		mod   func(*AuditRecord)
		where string
	}{
		{"hosts", func(r *AuditRecord) { r.Hosts = []string{"web-1", "web-2"} }, "web-1,web-2"},
		{"target", func(r *AuditRecord) { r.Tool, r.Target = "token.create", "k3jq7fz2xa" }, "target k3jq7fz2xa"},
		{"both", func(r *AuditRecord) { r.Hosts, r.Target = []string{"web-1"}, "k3jq7fz2xa" }, "web-1 target k3jq7fz2xa"},
		{"neither", func(r *AuditRecord) { r.Tool = "hosts" }, "-"},
	}
	want := -1
	for _, c := range cases {
		r := base
		c.mod(&r)
		cols := strings.Split(r.line(), "\t")
		if want < 0 {
			want = len(cols)
		}
		if len(cols) != want || cols[3] != c.where || cols[4] != decisionAllowed {
			t.Errorf("%s: columns %q: want %d, the fourth %q and the fifth the decision", c.name, cols, want, c.where)
		}
	}
}

// TestAuditLineNamesTokens: the audit text tells an API token from a
// provider's user of the same name.
func TestAuditLineNamesTokens(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tok := AuditRecord{Time: at, Caller: AuditCaller{Kind: access.KindAPIToken, Subject: "deploy"}, Tool: "read"}
	usr := AuditRecord{Time: at, Caller: AuditCaller{Kind: access.KindOIDC, Subject: "deploy"}, Tool: "read"}
	a, b := strings.Split(tok.line(), "\t")[1], strings.Split(usr.line(), "\t")[1]
	if a != "token deploy" || b != "deploy" {
		t.Errorf("callers shown as %q and %q, want \"token deploy\" and \"deploy\"", a, b)
	}
}
