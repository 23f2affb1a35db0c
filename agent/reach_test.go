//go:build unix

package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	agentid "github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The warnings about NATS out of reach: the first at once, then with a
// pause that doubles up to reachWarnMax; a success ends the run.
func TestReachLogBackoff(t *testing.T) {
	var r reachLog
	t0 := time.Now()
	var warned []time.Duration
	for s := time.Duration(0); s <= time.Hour; s += time.Second {
		if w, _ := r.failed(t0.Add(s)); w {
			warned = append(warned, s)
		}
	}
	want := []time.Duration{0, 30 * time.Second, 90 * time.Second, 210 * time.Second, 450 * time.Second, 930 * time.Second}
	for i, w := range want {
		if i >= len(warned) || warned[i] != w {
			t.Fatalf("warnings at %v, want them to start %v", warned, want)
		}
	}
	for i := 1; i < len(warned); i++ {
		if gap := warned[i] - warned[i-1]; gap > reachWarnMax {
			t.Errorf("a pause of %s between warnings, more than %s", gap, reachWarnMax)
		}
	}
	if len(warned) < 8 {
		t.Errorf("only %d warnings in an hour out of reach: %v", len(warned), warned)
	}
	if was, _ := r.ok(); !was {
		t.Error("ok after failures reports none")
	}
	if w, _ := r.failed(t0.Add(2 * time.Hour)); !w {
		t.Error("the first failure after a success is not a warning")
	}
}

// deadURL returns a NATS URL on loopback where nothing listens.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "nats://" + ln.Addr().String()
}

// fakeLocator gives the URLs the test sets.
type fakeLocator struct {
	urls  atomic.Pointer[[]string]
	asked atomic.Int32
	err   error
}

func (f *fakeLocator) Locate(context.Context) ([]string, bool, error) {
	f.asked.Add(1)
	if f.err != nil {
		return nil, false, f.err
	}
	return *f.urls.Load(), true, nil
}

// An agent whose NATS URL does not answer says which URL and why, with
// the next step; it asks the gateway for the current URLs, dials those
// and joins.
func TestUnreachableNATSLocated(t *testing.T) {
	ns, _, pres := watchedNATS(t)
	dead := deadURL(t)
	loc := &fakeLocator{}
	good := []string{ns.ClientURL()}
	loc.urls.Store(&good)
	var log lockedBuffer
	startAgent(t, ns, Config{Name: "lost-1", Locator: loc, ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond},
		func(a *Agent) {
			a.log = slog.New(slog.NewTextHandler(&log, nil))
			bad := []string{dead}
			a.servers.Store(&bad)
		})
	nextAnnounce(t, pres, "lost-1", false)
	out := log.String()
	for _, want := range []string{"level=WARN msg=\"cannot reach NATS at " + dead, "connection refused", "fleet-agent doctor",
		"the gateway gave other NATS URLs", "NATS reachable again"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if loc.asked.Load() != 1 {
		t.Errorf("the gateway was asked %d times for the URLs, want once", loc.asked.Load())
	}
}

// A host that the gateway says is revoked stops with a *RevokedError,
// saying once how to enrol again; it is not retried.
func TestRevokedAgentStops(t *testing.T) {
	f := startOperatorNATS(t, protocol.AgentPublishTemplate(), protocol.AgentSubscribeTemplate())
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	foreign := &opFleet{account: f.account}
	foreign.signer, _ = nkeys.CreateAccount()
	fr := &fakeRenewer{token: foreign.agentJWT(t, kp, "gone-1", time.Now().Add(time.Hour)), expires: time.Now().Add(time.Hour),
		recover: func() (string, time.Time, error) {
			return "", time.Time{}, &agentid.RefusedError{Op: "recovery",
				API: &protocol.APIError{Code: protocol.APIHostRevoked, Message: "host gone-1 was revoked"}}
		}}
	var log lockedBuffer
	r := startAgent(t, f.ns, Config{Name: "gone-1", Credentials: Credentials{JWT: fr.JWT, Seed: seed}, Renewer: fr,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 20 * time.Millisecond},
		func(a *Agent) { a.log = slog.New(slog.NewTextHandler(&log, nil)) })
	var err error
	select {
	case err = <-r.done:
		close(r.done)
	case <-time.After(20 * time.Second):
		t.Fatal("the revoked agent did not stop")
	}
	var rerr *RevokedError
	if !errors.As(err, &rerr) || rerr.Host != "gone-1" || !strings.Contains(err.Error(), "fleetctl token create --replace gone-1") ||
		!strings.Contains(err.Error(), "fleet-agent join --name gone-1") {
		t.Errorf("Run returned %v, want a *RevokedError saying how to enrol again", err)
	}
	if n := fr.asked.Load(); n != 1 {
		t.Errorf("recovery asked %d times", n)
	}
	if out := log.String(); strings.Contains(out, "recovery not allowed") || strings.Contains(out, "keeps trying") {
		t.Errorf("the log gives other advice too:\n%s", out)
	}
}

// A connected agent whose NATS server goes away for good, while the
// gateway hands out another: its own reconnects fail and say so, naming
// the URL; it asks for the current URLs, leaves the old connection and
// joins at the new one.
func TestMovedNATSLocated(t *testing.T) {
	old := startTestNATS(t)
	ns, _, pres := watchedNATS(t)
	loc := &fakeLocator{}
	moved := []string{ns.ClientURL()}
	loc.urls.Store(&moved)
	var log lockedBuffer
	r := startAgent(t, old, Config{Name: "moved-1", Locator: loc, ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond},
		func(a *Agent) { a.log = slog.New(slog.NewTextHandler(&log, nil)) })
	waitFor(t, 10*time.Second, "the agent to join the first server", func() bool {
		nc := r.a.nc.Load()
		return nc != nil && nc.IsConnected()
	})
	if n := loc.asked.Load(); n != 0 {
		t.Fatalf("the gateway was asked for the URLs %d times while NATS answered", n)
	}
	oldURL := old.ClientURL()
	old.Shutdown()
	nextAnnounce(t, pres, "moved-1", false)
	out := log.String()
	for _, want := range []string{"cannot reach NATS at " + oldURL, "connection refused", "fleet-agent doctor", "the gateway gave other NATS URLs"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
}
