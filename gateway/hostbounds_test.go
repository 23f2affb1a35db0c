package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// A host's signed refusal reports are believed only about calls the
// gateway sent it: a report naming a call never sent (with a caller and
// a text of the host's choosing) is counted and summarised once, never
// recorded as a caller's action; a report about a real call is recorded
// with the gateway's caller, tool and arguments and the host's reason
// code in the gateway's words, at most maxRefusalRecordsPerCall times
// (the caller whose call it ended gets the host's text, cleaned); and
// reports beyond the host's rate are dropped before anything else.
func TestRefusalReportsBounded(t *testing.T) {
	ns := startNATS(t, 0)
	r, _ := newTestRouter(t, ns, "web-1", 10*time.Second)
	fa := newFakeAgent(t, ns, "web-1")
	done := startCall(context.Background(), r, bashCall("web-1", "echo real"), nil)
	rc := recv(t, fa.calls, "call")
	report := func(host, id, caller, msg string) {
		data, _ := json.Marshal(protocol.Refusal{Host: host, Kind: protocol.MsgCall, Reason: protocol.RefusedReplayed,
			Message: msg, CallID: id, Tool: "bash", Caller: caller, At: time.Now()})
		sig, _ := testAgentKP.Sign(protocol.RefusalSigningBytes(data))
		m := &nats.Msg{Subject: protocol.RefusedSubject(host), Data: data,
			Header: nats.Header{protocol.HeaderReportSig: {base64.RawURLEncoding.EncodeToString(sig)}}}
		if err := fa.nc.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	const forged = "FORGED: alice ran rm -rf /"
	for range 10 {
		report("web-1", newCallID(), "alice", forged)
	}
	// web-1's call reported by another host is not that host's call.
	report("web-2", rc.call.ID, "alice", forged)
	report("web-1", rc.call.ID, "alice", "seen\nbefore\x1b[2J\u202e")
	out := <-done
	wantHostError(t, out.err, HostRefused, "refused the bash call", "replayed", "seen before")
	if strings.ContainsAny(out.err.Error(), "\n\x1b\u202e") {
		t.Errorf("the caller's error carries the host's control characters: %q", out.err)
	}
	// The call is over: reports about it still match it, a few times.
	for range 5 {
		report("web-1", rc.call.ID, "alice", "again")
	}
	if err := fa.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	c := &r.bounds.counts
	waitUntil(t, "every report counted", func() bool {
		return c.reportsNotSent.Load() == 11 && c.reportsCallCapped.Load() == 3
	})
	var recs []*audit.Record
	for len(r.refusalRecords) > 0 {
		recs = append(recs, <-r.refusalRecords)
	}
	var calls, summaries int
	for _, rec := range recs {
		data, _ := json.Marshal(rec)
		if strings.Contains(string(data), "alice") || strings.Contains(string(data), "rm -rf") {
			t.Errorf("a record carries what the host made up: %s", data)
		}
		switch rec.Caller.Kind {
		case string(access.KindHostReport):
			summaries++
			if rec.Tool != refusedMessagesTool || rec.Hosts[0] != "web-1" && rec.Hosts[0] != "web-2" {
				t.Errorf("summary record %s", data)
			}
		case string(access.KindOIDC):
			calls++
			if rec.Caller.Subject != "user-1" || rec.Caller.Email != "Ada" || rec.Tool != "bash" || string(rec.RawArgs) != string(rc.call.Args) ||
				rec.Target != "call "+rc.call.ID+" (its call message)" || rec.Reason != "replayed" || rec.Outcome != audit.OutcomeRefused {
				t.Errorf("refusal record %s (args %s)", data, rec.RawArgs)
			}
			if rec.Error != "refused by the host: "+reasonText("replayed") {
				t.Errorf("the record's error %q is not the gateway's words for the reason", rec.Error)
			}
		default:
			t.Errorf("record %s", data)
		}
	}
	// One summary at once per host that reported a message never sent
	// (web-1, web-2); the rest wait for the next summary.
	if calls != maxRefusalRecordsPerCall || summaries != 2 {
		t.Errorf("%d refusal records and %d summaries, want %d and 2", calls, summaries, maxRefusalRecordsPerCall)
	}
	tallies := r.bounds.takeUnsent()
	if len(tallies) != 1 || tallies["web-1"] == nil || tallies["web-1"].reports != 10 || tallies["web-1"].reasons["replayed"] != 10 {
		t.Errorf("tallies %+v", tallies)
	}

	// A flood: beyond the host's rate, reports are dropped unread.
	start := time.Now()
	before := c.reportsNotSent.Load()
	const flood = 400
	for range flood {
		report("web-1", newCallID(), "alice", forged)
	}
	if err := fa.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the flood counted", func() bool {
		return c.reportsNotSent.Load()-before+c.reportsRateLimited.Load() == flood
	})
	taken := c.reportsNotSent.Load() - before
	if bound := int64(reportBurst) + int64(time.Since(start).Seconds()*reportBurst/reportPeriod.Seconds()) + 1; taken > bound {
		t.Errorf("%d of %d flooded reports taken, want at most %d", taken, flood, bound)
	}
	if c.reportsRateLimited.Load() == 0 {
		t.Error("no report was dropped by the host's rate")
	}
}

// reportText leaves a host's text on one line, printable, short.
func TestReportText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"clocks apart", "clocks apart"},
		{"line\nbreak\r\nand\ttab", "line break  and tab"},
		{"\x1b[31mred\x1b[0m", "[31mred [0m"},
		{"bidi \u202egnp.exe", "bidi  gnp.exe"},
		{"bad \xff utf8", "bad ? utf8"},
		{strings.Repeat("a", 1000), strings.Repeat("a", reportTextMax) + "…"},
	} {
		if got := reportText(tc.in); got != tc.want {
			t.Errorf("reportText(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func FuzzReportText(f *testing.F) {
	f.Add("clocks apart")
	f.Add("a\nb\u202e\xff")
	f.Fuzz(func(t *testing.T, s string) {
		got := reportText(s)
		if len(got) > reportTextMax+len("…") || !utf8.ValidString(got) {
			t.Fatalf("reportText(%q) = %q", s, got)
		}
		for _, r := range got {
			if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == '\u2028' || r == '\u2029' {
				t.Fatalf("reportText(%q) = %q keeps %U", s, got, r)
			}
		}
	})
}

// Finished calls are remembered for recentCallsAge, at most
// recentCallsMax of them, and only small arguments are kept.
func TestRecentCalls(t *testing.T) {
	var rc recentCalls
	now := time.Now()
	big := json.RawMessage(`"` + strings.Repeat("x", recentArgsMax) + `"`)
	rc.add("old", &sentCall{host: "h", args: json.RawMessage(`{}`)}, now)
	rc.add("big", &sentCall{host: "h", args: big}, now)
	if s := rc.get("big"); s == nil || s.args != nil {
		t.Errorf("a large call's arguments kept: %+v", s)
	}
	if s := rc.get("old"); s == nil || string(s.args) != "{}" {
		t.Errorf("a small call's arguments not kept: %+v", s)
	}
	rc.add("later", &sentCall{host: "h"}, now.Add(recentCallsAge+time.Second))
	if rc.get("old") != nil || rc.get("big") != nil || rc.get("later") == nil {
		t.Error("calls older than recentCallsAge are kept")
	}
	for i := range recentCallsMax + 10 {
		rc.add(fmt.Sprint("c", i), &sentCall{host: "h"}, now.Add(recentCallsAge+2*time.Second))
	}
	if len(rc.byID) != recentCallsMax || rc.get("c9") != nil || rc.get(fmt.Sprint("c", recentCallsMax+9)) == nil {
		t.Errorf("%d calls kept, want the newest %d", len(rc.byID), recentCallsMax)
	}
	if len(rc.order)-rc.head != recentCallsMax || len(rc.order) > 2*recentCallsMax+1 {
		t.Errorf("order holds %d entries from %d", len(rc.order), rc.head)
	}
}

// Renewals: refused before half the credential's life, answered at once
// and not recorded; past it, a host gets renewBurst, then one per
// renewRefill, and those beyond are answered at once too, with neither
// a nonce stored nor a record written.
func TestRenewalBounds(t *testing.T) {
	for ttl, want := range map[time.Duration]time.Duration{720 * time.Hour: 15 * time.Minute, time.Hour: 15 * time.Minute,
		2 * time.Minute: 30 * time.Second, 6 * time.Second: 1500 * time.Millisecond, 2 * time.Second: time.Second} {
		if got := renewRefill(ttl); got != want {
			t.Errorf("renewRefill(%s) = %s, want %s (a quarter of the lifetime, within 1 s and 15 min)", ttl, got, want)
		}
	}
	clock := &testClock{t: time.Now()}
	gw := startAPIGateway(t, clock, nil)
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{Uses: 2})
	kp, other := newUser(t), newUser(t)
	first, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, time.Now()))
	if code != "" {
		t.Fatal(code)
	}
	nc := agentConn(t, gw, "web-1", kp, first)
	tap := tapAudit(t, gw)
	ask := func(data []byte) protocol.APICode {
		t.Helper()
		m, err := nc.Request(protocol.RenewSubject("web-1"), data, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_, code := renewAnswer(t, m)
		return code
	}
	renewals := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gw.subsys.audit.Sync(ctx)
		tap.mu.Lock()
		defer tap.mu.Unlock()
		n := 0
		for _, r := range tap.recs {
			if r.Tool == "renew" {
				n++
			}
		}
		return n
	}
	for range 50 {
		if code := ask(renewReq(t, kp, "web-1", clock.now())); code != protocol.APITooEarly {
			t.Fatalf("a renewal of a fresh credential: %q, want %q", code, protocol.APITooEarly)
		}
	}
	if n := gw.calling.bounds.counts.renewalsEarly.Load(); n != 50 {
		t.Errorf("%d early renewals counted, want 50", n)
	}
	clock.advance(361 * time.Hour)
	// Requests that pass the screen and fail (another key) take the
	// host's renewals like any.
	var codes []protocol.APICode
	for range renewBurst + 3 {
		codes = append(codes, ask(renewReq(t, other, "web-1", clock.now())))
	}
	want := []protocol.APICode{protocol.APIForbidden, protocol.APIForbidden, protocol.APIForbidden, protocol.APIForbidden,
		protocol.APIRateLimited, protocol.APIRateLimited, protocol.APIRateLimited}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Errorf("answers %v, want %v", codes, want)
	}
	// A renewal is recorded after its answer, and the tap hears the
	// record after the stream took it: wait for the ones due.
	waitUntil(t, "the renewals' records", func() bool { return renewals() >= renewBurst })
	if n := renewals(); n != renewBurst {
		t.Errorf("%d renewal records, want %d (the early and the rate-limited ones are not recorded)", n, renewBurst)
	}
	// A rate-limited request stored no nonce.
	data := renewReq(t, kp, "web-1", clock.now())
	if code := ask(data); code != protocol.APIRateLimited {
		t.Fatalf("%q, want %q", code, protocol.APIRateLimited)
	}
	var req protocol.RenewRequest
	_ = json.Unmarshal(data, &req)
	if _, err := nonceBucket(t, gw).Get(context.Background(), req.Nonce); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the nonce of a rate-limited renewal was stored: %v", err)
	}
	clock.advance(renewRefill(720 * time.Hour))
	if code := ask(renewReq(t, kp, "web-1", clock.now())); code != "" {
		t.Fatalf("the renewal after a refill: %q", code)
	}
	if code := ask(renewReq(t, kp, "web-1", clock.now())); code != protocol.APITooEarly {
		t.Errorf("a renewal right after one: %q, want %q", code, protocol.APITooEarly)
	}
	if n := gw.calling.bounds.counts.renewalsRateLimited.Load(); n != 4 {
		t.Errorf("%d rate-limited renewals counted, want 4", n)
	}
}

// A refusal record names the caller as the call's own record does.
func TestAuditCallerOf(t *testing.T) {
	for _, id := range []*access.Identity{
		access.LocalIdentity(),
		{Kind: access.KindAPIToken, Subject: "deploy"},
		{Kind: access.KindOIDC, Issuer: "https://idp.example", Subject: "u-1", Email: "ada@example.com", ClientID: "cli", Groups: []string{"ops"}},
	} {
		want := audit.Caller{Kind: string(id.Kind), Subject: id.Subject, Email: id.Email, ClientID: id.ClientID}
		if got := auditCallerOf(id.Caller()); got != want {
			t.Errorf("auditCallerOf(%+v) = %+v, want %+v", id.Caller(), got, want)
		}
	}
}

// nonceBucket is the bucket of the request nonces seen.
func nonceBucket(t *testing.T, gw *Gateway) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(gw.conns.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), "fleet_nonces")
	if err != nil {
		t.Fatal(err)
	}
	return kv
}
