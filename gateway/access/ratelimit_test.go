package access

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestParseRateLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want RateLimit
	}{
		{"", RateLimit{}},
		{"120", RateLimit{120, time.Minute}},
		{"120/min", RateLimit{120, time.Minute}},
		{" 10 / s ", RateLimit{10, time.Second}},
		{"3600/h", RateLimit{3600, time.Hour}},
	} {
		got, err := ParseRateLimit(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseRateLimit(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"0/min", "from 1 to"},
		{"-5", "from 1 to"},
		{"ten/min", "from 1 to"},
		{"10/day", `unknown period "day"`},
		{"2000000/s", "from 1 to 1000000"},
	} {
		_, err := ParseRateLimit(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseRateLimit(%q) error = %v, want one containing %q", tc.in, err, tc.want)
		}
	}
}

func FuzzParseRateLimit(f *testing.F) {
	for _, s := range []string{"", "1", "120/min", "5/s", "9/h", "x/y", "1/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseRateLimit(s)
		if err != nil {
			return
		}
		if strings.TrimSpace(s) == "" {
			if !l.Unlimited() {
				t.Fatalf("%q parsed as %v, want unlimited", s, l)
			}
			return
		}
		if l.N < 1 || l.N > maxRateCalls || (l.Period != time.Second && l.Period != time.Minute && l.Period != time.Hour) {
			t.Fatalf("%q parsed as out-of-range %+v", s, l)
		}
		if !strings.HasPrefix(l.String(), fmt.Sprintf("%d calls per ", l.N)) || l.perSecond() <= 0 {
			t.Fatalf("%q: parsed as %q, rate %v", s, l, l.perSecond())
		}
	})
}

func TestRateLimitFromRules(t *testing.T) {
	rules, err := ParseRules("rules.yaml", []byte(`
rules:
  - name: everyone
    match: {sub: "*"}
    hosts: ["*"]
    tools: [read]
    rate_limit: 60/min
  - name: ops
    match: {groups: ops}
    hosts: ["*"]
    tools: ["*"]
    rate_limit: 10/s
  - name: auditors
    match: {groups: audit}
    admin: true
`))
	if err != nil {
		t.Fatal(err)
	}
	def := RateLimit{100, time.Minute}
	for _, tc := range []struct {
		groups []string
		want   RateLimit
		rule   string
	}{
		{nil, RateLimit{60, time.Minute}, "everyone"},
		{[]string{"ops"}, RateLimit{10, time.Second}, "ops"},          // the most generous
		{[]string{"audit"}, def, ""},                                  // a rule without a limit gives the default
		{[]string{"ops", "audit"}, RateLimit{10, time.Second}, "ops"}, // 10/s beats the 100/min default
	} {
		id := &Identity{Kind: KindOIDC, Subject: "u", claims: map[string]any{"groups": toAny(tc.groups)}}
		got := rules.For(id).RateLimit(def)
		if got.Limit != tc.want || got.Rule != tc.rule {
			t.Errorf("groups %v: limit %v from %q, want %v from %q", tc.groups, got.Limit, got.Rule, tc.want, tc.rule)
		}
	}
	// Without a default, a matching rule with no limit means unlimited.
	id := &Identity{Kind: KindOIDC, Subject: "u", claims: map[string]any{"groups": []any{"audit"}}}
	if got := rules.For(id).RateLimit(RateLimit{}); !got.Limit.Unlimited() {
		t.Errorf("no default: got %v, want unlimited", got.Limit)
	}

	if _, err := ParseRules("deny.yaml", []byte("rules:\n  - deny: true\n    match: {sub: \"*\"}\n    hosts: [\"*\"]\n    tools: [bash]\n    rate_limit: 5/min\n")); err == nil || !strings.Contains(err.Error(), "deny rule limits nothing") {
		t.Errorf("rate_limit on a deny rule: error %v", err)
	}
	if _, err := ParseRules("bad.yaml", []byte("rules:\n  - match: {sub: \"*\"}\n    hosts: [\"*\"]\n    tools: [bash]\n    rate_limit: lots\n")); err == nil || !strings.Contains(err.Error(), "rate_limit: rate limit \"lots\"") {
		t.Errorf("bad rate_limit: error %v", err)
	}
}

func TestRateLimitersBucket(t *testing.T) {
	var rl RateLimiters
	lim := RateLimit{3, time.Minute}
	now := time.Unix(1_000_000, 0)
	for i := range 3 {
		if ok, _ := rl.Allow("a", lim, now); !ok {
			t.Fatalf("call %d refused within the burst", i+1)
		}
	}
	ok, wait := rl.Allow("a", lim, now)
	if ok || wait < 19*time.Second || wait > 21*time.Second {
		t.Fatalf("4th call: ok=%v wait=%v, want refused with about 20 s to wait", ok, wait)
	}
	// A refused call takes nothing: after the wait exactly one more fits.
	if ok, _ := rl.Allow("a", lim, now.Add(wait)); !ok {
		t.Fatal("call after the announced wait refused")
	}
	if ok, _ := rl.Allow("a", lim, now.Add(wait)); ok {
		t.Fatal("a second call after one refill allowed")
	}
	// Another caller has its own bucket.
	if ok, _ := rl.Allow("b", lim, now); !ok {
		t.Fatal("caller b limited by caller a's calls")
	}
	if ok, _ := rl.Allow("c", RateLimit{}, now); !ok || rl.size() != 2 {
		t.Fatalf("unlimited caller: ok=%v, buckets %d (want 2: unlimited callers keep none)", ok, rl.size())
	}
	// Once refilled, buckets are swept.
	later := now.Add(2 * time.Minute)
	rl.Allow("d", lim, later)
	if rl.size() != 1 {
		t.Fatalf("after the sweep %d buckets remain, want only d's", rl.size())
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
