package load

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/integration"
)

// Forged content a flooding host puts in its reports: neither may reach
// the audit trail.
const (
	floodCaller = "mallory-forged-caller"
	floodText   = "FORGED-TEXT: alice ran rm -rf /"
)

// stolenHost connects to NATS with an enrolled host's own files from its
// state directory (its key, credential and CA): what an attacker who
// owns the machine holds.
func stolenHost(t *testing.T, env *integration.Env, host, stateDir string) (*nats.Conn, nkeys.KeyPair) {
	t.Helper()
	store := identity.Open(stateDir)
	kp, err := store.LoadKey()
	if err != nil {
		t.Fatal(err)
	}
	token, err := store.LoadJWT()
	if err != nil {
		t.Fatal(err)
	}
	enr, err := store.LoadEnrolment()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	opts := []nats.Option{nats.UserJWTAndSeed(token, string(seed)), nats.CustomInboxPrefix(protocol.AgentInboxPrefix(host))}
	if enr.NATSCA != "" {
		opts = append(opts, integration.AgentTLS([]byte(enr.NATSCA)))
	}
	nc, err := nats.Connect(env.NATSURL(), opts...)
	if err != nil {
		t.Fatalf("connect with %s's stolen files: %v", host, err)
	}
	t.Cleanup(nc.Close)
	return nc, kp
}

// signedReport is a refusal report of host's, signed with its key, about
// call id, with a caller and a text of the host's choosing.
func signedReport(t *testing.T, kp nkeys.KeyPair, host, id string) *nats.Msg {
	t.Helper()
	data, _ := json.Marshal(protocol.Refusal{Host: host, Kind: protocol.MsgCall, Reason: protocol.RefusedReplayed, Message: floodText,
		CallID: id, Tool: "bash", Caller: floodCaller, At: time.Now()})
	sig, err := kp.Sign(protocol.RefusalSigningBytes(data))
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Subject: protocol.RefusedSubject(host), Data: data,
		Header: nats.Header{protocol.HeaderReportSig: {base64.RawURLEncoding.EncodeToString(sig)}}}
}

// auditCount returns the number of records in the audit stream.
func auditCount(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, protocol.AuditStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestFloodingHost: the owner of one enrolled host, with the host's own
// files from its state directory, floods the gateway for three seconds
// with refusal reports signed with the host's key (naming a caller and a
// text of its choosing, about calls never sent and about one that was)
// and with signed renewal requests. The trail takes at most its bound
// (1,000 records a minute), none of them naming the forged caller or
// quoting the forged text, the real call's refusal is recorded with the
// gateway's own caller and tool, the drop counters move, no renewal is
// made or recorded (the credential is fresh), and another host's calls
// keep their latency: the median during the flood within three times
// (and 25 ms) that during a control flood of the same messages on a
// subject nobody hears (which costs the machine the flooder's own work,
// as this test runs the flooder beside the gateway). The rogue's
// connection beside the live agent is an identity conflict as well: the
// real call is made before it connects, and the host stands refused
// after the flood.
func TestFloodingHost(t *testing.T) {
	env := integration.NewEnv(t, integration.Options{ExternalNATS: true, Agents: []string{"honest"}, Gateway: func(c *gateway.Config) {
		c.Metrics, c.MetricsListen = true, "127.0.0.1:0"
	}})
	env.StartAgentProcess("victim")
	env.WaitHost("victim", true)
	cs := env.Client("", nil)
	wire := env.GatewayConn()
	js, _ := jetstream.New(wire)

	// A real call to the host, seen on its own subject, made before the
	// rogue connects: the rogue's connection beside the live agent is
	// two connections on one identity, and once the gateway has found
	// that (within seconds) it refuses every call to the host.
	calls, stop := integration.Capture(t, wire, protocol.CallSubject("victim"))
	integration.MustOK(t, integration.Call(t, cs, "bash", map[string]any{"host": "victim", "command": "echo real"}))
	realID := integration.NextMsg(t, calls, "the real call on the wire").Header.Get(protocol.HeaderCall)
	stop()
	rogue, kp := stolenHost(t, env, "victim", filepath.Join(env.AgentDir("victim"), ".state"))

	honest := func() time.Duration {
		start := time.Now()
		integration.MustOK(t, integration.Call(t, cs, "bash", map[string]any{"host": "honest", "command": "echo ok"}))
		return time.Since(start)
	}
	var baseline []time.Duration
	for range 15 {
		baseline = append(baseline, honest())
	}
	var answerMu sync.Mutex
	answers := map[protocol.APICode]int{}
	const floodFor = 3 * time.Second
	answerSub, err := rogue.Subscribe(protocol.AgentInboxPrefix("victim")+".>", func(m *nats.Msg) {
		if m.Header.Get("Status") != "" {
			return // no responders: the control flood's requests
		}
		var e protocol.APIError
		_ = json.Unmarshal(m.Data, &e)
		answerMu.Lock()
		answers[e.Code]++
		answerMu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = answerSub.Unsubscribe() }()

	// The flood, at full speed for floodFor, from this process: first
	// on a subject of the host's that nobody hears (the control: what
	// the flooder's own work costs the machine), then at the gateway.
	// The honest host's calls are timed throughout.
	var forged []*nats.Msg
	for i := range 500 {
		forged = append(forged, signedReport(t, kp, "victim", fmt.Sprintf("c%024x", i+1)))
	}
	real := signedReport(t, kp, "victim", realID)
	unheard := strings.TrimSuffix(protocol.AgentSubjects("victim"), ">") + "unheard"
	flood := func(reportSubject, renewSubject string) (reports, renewals int, timed []time.Duration) {
		deadline := time.Now().Add(floodFor)
		var wg sync.WaitGroup
		wg.Go(func() {
			for ; time.Now().Before(deadline) && reports < 100_000; reports++ {
				m := forged[reports%len(forged)]
				if reports%50 == 0 {
					m = real
				}
				if err := rogue.PublishMsg(&nats.Msg{Subject: reportSubject, Header: m.Header, Data: m.Data}); err != nil {
					t.Error(err)
					return
				}
				if reports%1000 == 999 {
					_ = rogue.Flush()
				}
			}
		})
		wg.Go(func() {
			for ; time.Now().Before(deadline) && renewals < 20_000; renewals++ {
				r := &protocol.RenewRequest{Host: "victim"}
				if err := enrolclient.Sign(kp, &r.Proof, time.Now(), r.SigningBytes); err != nil {
					t.Error(err)
					return
				}
				data, _ := json.Marshal(r)
				if err := rogue.PublishRequest(renewSubject, rogue.NewInbox(), data); err != nil {
					t.Error(err)
					return
				}
				if renewals%200 == 199 {
					_ = rogue.Flush()
				}
			}
		})
		for time.Now().Before(deadline) || len(timed) < 15 {
			timed = append(timed, honest())
		}
		wg.Wait()
		if err := rogue.Flush(); err != nil {
			t.Fatal(err)
		}
		return reports, renewals, timed
	}
	_, _, control := flood(unheard+".refused", unheard+".renew")
	before := auditCount(t, js)
	reports, renewals, flooded := flood(protocol.RefusedSubject("victim"), protocol.RenewSubject("victim"))
	// Settled: the trail stops growing.
	after, last := auditCount(t, js), time.Now()
	for time.Since(last) < 2*time.Second {
		time.Sleep(250 * time.Millisecond)
		if n := auditCount(t, js); n != after {
			after, last = n, time.Now()
		}
	}
	added := after - before
	base, ctl, under := median(baseline), median(control), median(flooded)
	t.Logf("flood of %s: %d signed reports, %d renewal requests; %d audit records added (%d of them the honest host's calls)",
		floodFor, reports, renewals, added, len(flooded))
	t.Logf("honest calls, median: %s alone, %s under the control flood, %s under the flood (%.2fx the control)",
		base, ctl, under, float64(under)/float64(ctl))

	// The honest host's calls leave a record each; what the flood adds
	// beyond them is held to the bound of 1,000 a minute, pro rata.
	if byFlood, bound := int(added)-len(flooded), int(1000*floodFor/time.Minute); byFlood > bound {
		t.Errorf("the flood added %d audit records in %s (besides %d for the honest calls); the bound is 1,000 a minute, %d in %s",
			byFlood, floodFor, len(flooded), bound, floodFor)
	}
	// What the gateway's handling of the flood (and the NATS server's
	// delivering it) adds, beyond what the flooder's own work costs this
	// machine: generous, as the test shares a small machine with the
	// flooder and the server (integration/README.md has the
	// measurement). The flood used to stall every call behind a full
	// audit queue.
	if limit := 3*ctl + 25*time.Millisecond; under > limit {
		t.Errorf("the honest host's calls took %s (median) during the flood, %s during the control: more than %s", under, ctl, limit)
	}

	recs := integration.AuditRecords(t, cs, map[string]any{"host": "victim", "limit": 500})
	var realRefusal bool
	for _, r := range recs {
		data, _ := json.Marshal(r)
		if strings.Contains(string(data), floodCaller) || strings.Contains(string(data), "FORGED-TEXT") || strings.Contains(string(data), "rm -rf") {
			t.Fatalf("a record carries what the host made up: %s", data)
		}
		if r.Tool == "renew" {
			t.Errorf("a renewal of a fresh credential was recorded: %s", data)
		}
		if strings.HasPrefix(r.Target, "call "+realID) {
			realRefusal = true
			if r.Caller.Kind != string(access.KindLocal) || r.Tool != "bash" || r.Reason != string(protocol.RefusedReplayed) {
				t.Errorf("the real call's refusal is recorded as %s", data)
			}
		}
	}
	if !realRefusal {
		t.Error("the refusal report about the real call is not in the trail")
	}

	// Which of the flood's reports about the real call passed the
	// host's bound is chance: once the bound has room again, the report
	// comes until one is dropped because the call's refusals are
	// recorded already.
	integration.WaitFor(t, 20*time.Second, "a report about the recorded call to be dropped as such", func() bool {
		if err := rogue.PublishMsg(&nats.Msg{Subject: protocol.RefusedSubject("victim"), Header: real.Header, Data: real.Data}); err != nil {
			t.Fatal(err)
		}
		_ = rogue.Flush()
		return integration.Scrape(t, env.Gateway.MetricsURL())[`fleet_refusal_reports_dropped_total{reason="call_recorded"}`] > 0
	})
	m := integration.Scrape(t, env.Gateway.MetricsURL())
	for _, series := range []string{`fleet_refusal_reports_dropped_total{reason="rate_limited"}`, `fleet_refusal_reports_dropped_total{reason="not_sent"}`,
		`fleet_refusal_reports_dropped_total{reason="call_recorded"}`, `fleet_renewals_refused_total{reason="too_early"}`} {
		if m[series] == 0 {
			t.Errorf("%s did not move", series)
		}
	}
	// Every renewal request answered was refused as too early.
	answerMu.Lock()
	defer answerMu.Unlock()
	t.Logf("renewal answers: %v", answers)
	if len(answers) != 1 || answers[protocol.APITooEarly] == 0 {
		t.Errorf("renewal answers %v, want only %s", answers, protocol.APITooEarly)
	}
	// The rogue connected with the host's own files beside its live
	// agent, for longer than the flood: the host stands in conflict and
	// its calls are refused.
	if h, _ := env.Gateway.Host("victim"); !h.IdentityConflict {
		t.Errorf("the rogue beside the live agent is no conflict: %+v", h.Conflict)
	}
	integration.MustErr(t, integration.Call(t, cs, "bash", map[string]any{"host": "victim", "command": "echo after"}), "live NATS connections use this host's identity")
}
