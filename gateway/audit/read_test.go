package audit

import (
	"strings"
	"testing"
	"time"
)

func TestParseAuditQuery(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	good := []struct {
		in           Filter
		limit        int
		since, until time.Time
	}{
		{Filter{}, defaultAuditLimit, time.Time{}, time.Time{}},
		{Filter{Limit: 5000}, MaxLimit, time.Time{}, time.Time{}},
		{Filter{Since: "2h"}, defaultAuditLimit, now.Add(-2 * time.Hour), time.Time{}},
		{Filter{Since: "2026-04-30T00:00:00Z", Until: "1h"}, defaultAuditLimit, time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC), now.Add(-time.Hour)},
	}
	for _, tc := range good {
		q, err := ParseQuery(tc.in, now)
		if err != nil || q.limit != tc.limit || !q.since.Equal(tc.since) || !q.until.Equal(tc.until) {
			t.Errorf("ParseQuery(%+v) = %+v, %v", tc.in, q, err)
		}
	}
	bad := []struct {
		in   Filter
		want string
	}{
		{Filter{Decision: "maybe"}, "allowed or denied"},
		{Filter{Limit: -1}, "limit -1"},
		{Filter{Since: "yesterday"}, `since: "yesterday" is neither`},
		{Filter{Until: "-5m"}, "until:"},
		{Filter{Since: "1h", Until: "2h"}, "is not before until"},
	}
	for _, tc := range bad {
		if _, err := ParseQuery(tc.in, now); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseQuery(%+v) = %v, want an error mentioning %q", tc.in, err, tc.want)
		}
	}
}

func TestAuditQueryMatch(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	r := &Record{Time: at, Tool: "bash", Hosts: []string{"web-1"}, Decision: DecisionDenied,
		Caller: Caller{Subject: "u-1", Email: "Ada@Example.com", ClientID: "claude-code"}}
	tests := []struct {
		q    Query
		want bool
	}{
		{Query{}, true},
		{Query{caller: "ada@"}, true},
		{Query{caller: "claude"}, true},
		{Query{caller: "bob"}, false},
		{Query{host: "web-1", tool: "bash", decision: DecisionDenied}, true},
		{Query{host: "web-2"}, false},
		{Query{decision: DecisionAllowed}, false},
		{Query{since: at}, true},
		{Query{since: at.Add(time.Second)}, false},
		{Query{until: at}, false},
		{Query{until: at.Add(time.Second)}, true},
	}
	for _, tc := range tests {
		if got := tc.q.match(r); got != tc.want {
			t.Errorf("%+v matches = %v, want %v", tc.q, got, tc.want)
		}
	}
	// "token deploy" finds the API token deploy, not a provider's user
	// named like it; "deploy" finds both.
	tok := &Record{Time: at, Caller: Caller{Kind: callerAPIToken, Subject: "deploy"}}
	usr := &Record{Time: at, Caller: Caller{Kind: "oidc", Subject: "deploy"}}
	for _, tc := range []struct {
		q        string
		tok, usr bool
	}{{"token deploy", true, false}, {"deploy", true, true}} {
		q := Query{caller: tc.q}
		if q.match(tok) != tc.tok || q.match(usr) != tc.usr {
			t.Errorf("caller %q: token %v, user %v; want %v, %v", tc.q, q.match(tok), q.match(usr), tc.tok, tc.usr)
		}
	}
}

// An audit row keeps its columns in place whether the call went to hosts,
// to a target, to both or to neither.
func TestAuditLineColumns(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	base := Record{Time: at, Caller: Caller{Subject: "ops"}, Tool: "bash", Decision: DecisionAllowed, Outcome: OutcomeOK, DurationMS: 12}
	cases := []struct {
		name  string
		mod   func(*Record)
		where string
	}{
		{"hosts", func(r *Record) { r.Hosts = []string{"web-1", "web-2"} }, "web-1,web-2"},
		{"target", func(r *Record) { r.Tool, r.Target = "token.create", "k3jq7fz2xa" }, "target k3jq7fz2xa"},
		{"both", func(r *Record) { r.Hosts, r.Target = []string{"web-1"}, "k3jq7fz2xa" }, "web-1 target k3jq7fz2xa"},
		{"neither", func(r *Record) { r.Tool = "hosts" }, "-"},
	}
	want := -1
	for _, c := range cases {
		r := base
		c.mod(&r)
		cols := strings.Split(r.Line(), "\t")
		if want < 0 {
			want = len(cols)
		}
		if len(cols) != want || cols[3] != c.where || cols[4] != DecisionAllowed {
			t.Errorf("%s: columns %q: want %d, the fourth %q and the fifth the decision", c.name, cols, want, c.where)
		}
	}
}

// TestAuditLineNamesTokens: the audit text tells an API token from a
// provider's user of the same name.
func TestAuditLineNamesTokens(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tok := Record{Time: at, Caller: Caller{Kind: callerAPIToken, Subject: "deploy"}, Tool: "read"}
	usr := Record{Time: at, Caller: Caller{Kind: "oidc", Subject: "deploy"}, Tool: "read"}
	a, b := strings.Split(tok.Line(), "\t")[1], strings.Split(usr.Line(), "\t")[1]
	if a != "token deploy" || b != "deploy" {
		t.Errorf("callers shown as %q and %q, want \"token deploy\" and \"deploy\"", a, b)
	}
}
