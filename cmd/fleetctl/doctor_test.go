package main

import (
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

func TestDoctorSkew(t *testing.T) {
	server := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		skew time.Duration
		want checkStatus
		say  string
	}{
		{0, checkOK, "0s ahead of"},
		{-30 * time.Second, checkOK, "30s behind"},
		{2 * time.Minute, checkWarn, "2m0s ahead of"},
		{-6 * time.Minute, checkFail, "NTP"},
	} {
		r := skewCheck(server, server.Add(tc.skew))
		if r.status != tc.want || !strings.Contains(r.detail+" "+r.fix, tc.say) {
			t.Errorf("skew %s: %v %q %q, want %v saying %q", tc.skew, r.status, r.detail, r.fix, tc.want, tc.say)
		}
	}
}

func TestDoctorCert(t *testing.T) {
	ca := newTestCA(t, "fleet CA")
	leaf, err := x509.ParseCertificate(ca.serverCert(t, "127.0.0.1").Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	// The test certificate is valid from an hour ago for a day.
	for _, tc := range []struct {
		at   time.Time
		want checkStatus
	}{
		{leaf.NotAfter.Add(-30 * 24 * time.Hour), checkFail}, // before NotBefore
		{leaf.NotBefore.Add(time.Minute), checkWarn},         // under 14 days left
		{leaf.NotAfter.Add(time.Minute), checkFail},
	} {
		if r := certCheck("c", leaf, tc.at); r.status != tc.want {
			t.Errorf("at %s: %v %q, want %v", tc.at, r.status, r.detail, tc.want)
		}
	}
}

func TestDoctorFleet(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	agent := func(host, version string, online bool, expires time.Duration, revoked bool) protocol.AgentInfo {
		a := protocol.AgentInfo{Host: host, AgentVersion: version, Online: online, CredentialExpiresAt: now.Add(expires),
			Facts: protocol.AgentFacts{OS: "linux", Arch: "amd64"}}
		if revoked {
			a.RevokedAt = now.Add(-day)
		}
		return a
	}
	find := func(rs []checkResult, check string) checkResult {
		for _, r := range rs {
			if r.check == check {
				return r
			}
		}
		t.Fatalf("no %s check in %+v", check, rs)
		return checkResult{}
	}
	healthy := fleetChecks([]protocol.AgentInfo{agent("a", "1.0", true, 20*day, false), agent("b", "1.0", true, 25*day, false)}, now)
	for _, r := range healthy {
		if r.status != checkOK {
			t.Errorf("healthy fleet: %+v", r)
		}
	}
	if r := find(healthy, "hosts"); r.detail != "2 enrolled, 2 online, 0 offline, 0 revoked" {
		t.Errorf("hosts: %q", r.detail)
	}
	rs := fleetChecks([]protocol.AgentInfo{
		agent("a", "1.0", true, 20*day, false),
		agent("b", "1.1", true, 3*day, false),
		agent("c", "", false, -day, false),
		agent("d", "0.9", false, -day, true), // revoked: counted only as revoked
	}, now)
	if r := find(rs, "agent versions"); r.status != checkWarn || !strings.Contains(r.detail, "1.0 (1), 1.1 (1)") || !strings.Contains(r.detail, "1 not known") || strings.Contains(r.detail, "0.9") {
		t.Errorf("versions: %+v", r)
	}
	if r := find(rs, "credentials"); r.status != checkWarn || !strings.Contains(r.detail, "expired: c") || !strings.Contains(r.detail, "expiring within 7 days: b") {
		t.Errorf("credentials: %+v", r)
	}
	if r := find(rs, "offline hosts"); r.status != checkWarn || r.detail != "c" {
		t.Errorf("offline: %+v", r)
	}
	if r := find(rs, "revoked hosts"); !strings.HasPrefix(r.detail, "d ") {
		t.Errorf("revoked: %+v", r)
	}
	if r := find(rs, "platforms"); r.detail != "linux/amd64 (3)" {
		t.Errorf("platforms: %+v", r)
	}
	many := make([]string, 12)
	for i := range many {
		many[i] = string(rune('a' + i))
	}
	if got := names(many); !strings.HasSuffix(got, "j and 2 more") {
		t.Errorf("names: %q", got)
	}
}

// fleetctl doctor against the fake gateway: an admin passes, a token
// that is not an admin's fails (exit 1), and an MCP endpoint that is not
// ready fails.
func TestDoctorCommand(t *testing.T) {
	g := startFakeGateway(t)
	r := fleetctl(t, adminEnv(g), "doctor")
	if r.code != 0 {
		t.Fatalf("exit %d: %v\n%s%s", r.code, r.err, r.stdout, r.stderr)
	}
	contains(t, "doctor", r.stdout, "ok    admin API ", "ok    admin rights       this token is an admin's", "ok    clock skew", "warn  admin API cert", "revoked hosts      db-1")
	env := adminEnv(g)
	env["FLEET_API_TOKEN"] = userToken
	r = fleetctl(t, env, "doctor")
	if r.code != 1 || !strings.Contains(r.stdout, "FAIL  admin rights") || !strings.Contains(r.stdout, "not an admin's") {
		t.Errorf("a user's token: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	notReady := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		http.Error(w, "nats: not connected", http.StatusServiceUnavailable)
	}))
	defer notReady.Close()
	r = fleetctl(t, adminEnv(g), "doctor", "--mcp_url", notReady.URL+"/mcp")
	if r.code != 1 || !strings.Contains(r.stdout, "FAIL  gateway ready") || !strings.Contains(r.stdout, "nats: not connected") {
		t.Errorf("not ready: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	env = adminEnv(g)
	env["FLEET_CA_PIN"] = newTestCA(t, "other").pin
	r = fleetctl(t, env, "doctor")
	if r.code != 1 || !strings.Contains(r.stdout, "FAIL  admin API") || !strings.Contains(r.stdout, "none of them") {
		t.Errorf("another CA: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = fleetctl(t, env, "doctor", "--json")
	var checks []struct{ Check, Status, Detail, Fix string }
	if err := json.Unmarshal([]byte(r.stdout), &checks); err != nil || r.code != 1 || len(checks) != 1 || checks[0].Status != "fail" || checks[0].Check != "admin API" {
		t.Errorf("--json: exit %d, %v, %+v\n%s", r.code, err, checks, r.stdout)
	}
	if r := fleetctl(t, adminEnv(g), "doctor", "extra"); r.code != 2 {
		t.Errorf("an argument: exit %d", r.code)
	}
}
