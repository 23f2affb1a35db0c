//go:build unix

package agent

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	agentid "github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// oldIdentity is an identity whose first credential looks old enough to
// be renewed (issued long before it expires), so the loop renews at its
// first look; renewed ones show their real validity.
type oldIdentity struct {
	*agentid.Identity
	first string
}

func (o *oldIdentity) Validity() (time.Time, time.Time) {
	issued, expires := o.Identity.Validity()
	if token, _ := o.JWT(); token == o.first {
		return expires.Add(-24 * time.Hour), expires
	}
	return issued, expires
}

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A credential due for renewal is renewed over the agent's own NATS
// connection: a signed request on its host's renew subject, answered on
// its own inbox. A refusal, and an answer with a credential that is not
// the agent's, are logged and retried with backoff; the good answer is
// stored and becomes the current credential.
func TestRenewOverNATS(t *testing.T) {
	f := startOperatorNATS(t, protocol.AgentPublishTemplate(), protocol.AgentSubscribeTemplate())
	const host = "renew-2"
	state := t.TempDir()
	store := agentid.Open(state)
	kp, err := store.LoadOrCreateKey()
	if err != nil {
		t.Fatal(err)
	}
	first := f.agentJWT(t, kp, host, time.Now().Add(time.Hour))
	if err := store.SaveJWT(first); err != nil {
		t.Fatal(err)
	}
	if err := store.SaveEnrolment(&agentid.Enrolment{Host: host, NATSURLs: []string{f.ns.ClientURL()}}); err != nil {
		t.Fatal(err)
	}
	id, err := agentid.Load(state)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	other, _ := nkeys.CreateUser()

	// The gateway's side, as the contract says: the subject names the
	// host, the signature proves the key.
	var mu sync.Mutex
	var requests int
	var renewed string
	var problems []string
	gw := f.watcher(t)
	_, err = gw.Subscribe(protocol.RenewSubjectAll, func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		requests++
		var req protocol.RenewRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			problems = append(problems, "not a RenewRequest: "+err.Error())
			return
		}
		sig, _ := base64.RawURLEncoding.DecodeString(req.Signature)
		vk, err := nkeys.FromPublicKey(req.PublicKey)
		if err != nil || vk.Verify(req.SigningBytes(), sig) != nil || req.PublicKey != pub {
			problems = append(problems, "the signature does not verify with the agent's key")
		}
		if m.Subject != protocol.RenewSubject(req.Host) || req.Host != host || req.CheckTime(time.Now()) != nil || protocol.CheckNonce(req.Nonce) != nil {
			problems = append(problems, "subject, host, time or nonce wrong: "+m.Subject)
		}
		if !strings.HasPrefix(m.Reply, protocol.AgentInboxPrefix(host)+".") {
			problems = append(problems, "reply not to the agent's inbox: "+m.Reply)
		}
		var answer any
		switch requests {
		case 1:
			answer = &protocol.APIError{Code: protocol.APIUnavailable, Message: "the gateway is busy"}
		case 2:
			answer = &protocol.RenewResponse{JWT: f.agentJWT(t, other, host, time.Now().Add(time.Hour))}
		default:
			renewed = f.agentJWT(t, kp, host, time.Now().Add(2*time.Hour))
			answer = &protocol.RenewResponse{JWT: renewed, Expires: time.Now().Add(2 * time.Hour)}
		}
		data, _ := json.Marshal(answer)
		_ = m.Respond(data)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = gw.Flush()

	var log lockedBuffer
	r := startAgent(t, f.ns, Config{Name: host, Credentials: Credentials{JWT: id.JWT, Seed: id.Seed},
		Renewer: &oldIdentity{Identity: id, first: first}},
		func(a *Agent) {
			a.log = slog.New(slog.NewTextHandler(&log, nil))
			a.renewRetry = 20 * time.Millisecond
		})
	waitFor(t, 20*time.Second, "the renewed credential", func() bool {
		token, _ := id.JWT()
		return token != first
	})
	mu.Lock()
	if requests != 3 || len(problems) > 0 {
		t.Errorf("%d requests; problems: %q", requests, problems)
	}
	want := renewed
	mu.Unlock()
	if got, _ := id.JWT(); got != want {
		t.Error("the current credential is not the one the gateway answered last")
	}
	if onDisk, _ := store.LoadJWT(); onDisk != want {
		t.Error("the renewed credential was not stored")
	}
	r.cancel()
	r.wait(t, 10*time.Second)
	out := log.String()
	for _, s := range []string{"credential renewal failed", "unavailable", "not for this agent's key", "credential renewed"} {
		if !strings.Contains(out, s) {
			t.Errorf("the log does not say %q:\n%s", s, out)
		}
	}
}

// fakeRenewer stands for an identity whose recovery the test decides.
type fakeRenewer struct {
	mu      sync.Mutex
	token   string
	expires time.Time
	recover func() (string, time.Time, error)
	asked   atomic.Int32
}

func (f *fakeRenewer) JWT() (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.token, nil
}

func (f *fakeRenewer) Validity() (time.Time, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.expires.Add(-time.Hour), f.expires
}

func (f *fakeRenewer) Renew(context.Context, func(context.Context, string, []byte) ([]byte, error)) error {
	return nil
}

func (f *fakeRenewer) Recover(context.Context) error {
	f.asked.Add(1)
	token, expires, err := f.recover()
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.token, f.expires = token, expires
	return nil
}

// An agent whose credential has expired, or that NATS refuses, asks the
// gateway for a recovery once per state; given a new credential it joins
// at once; refused, it says to join again with a new token, once, and
// keeps trying to connect without asking again.
func TestRecoveryWhenTheCredentialFails(t *testing.T) {
	f := startOperatorNATS(t, protocol.AgentPublishTemplate(), protocol.AgentSubscribeTemplate())
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pres := presence(t, f.watcher(t))
	// A credential the servers do not accept: issued by an account they
	// do not know, for the right key and host.
	foreign := &opFleet{account: f.account}
	foreign.signer, _ = nkeys.CreateAccount()

	for _, tc := range []struct {
		name    string
		token   string
		expires time.Time
	}{
		{"expired", f.agentJWT(t, kp, "rec-1", time.Now().Add(-time.Minute)), time.Now().Add(-time.Minute)},
		{"refused", foreign.agentJWT(t, kp, "rec-1", time.Now().Add(time.Hour)), time.Now().Add(time.Hour)},
	} {
		t.Run(tc.name+", recovered", func(t *testing.T) {
			good := f.agentJWT(t, kp, "rec-1", time.Now().Add(time.Hour))
			fr := &fakeRenewer{token: tc.token, expires: tc.expires,
				recover: func() (string, time.Time, error) { return good, time.Now().Add(time.Hour), nil }}
			r := startAgent(t, f.ns, Config{Name: "rec-1", Credentials: Credentials{JWT: fr.JWT, Seed: seed}, Renewer: fr,
				ReconnectMin: 10 * time.Millisecond, ReconnectMax: 50 * time.Millisecond}, nil)
			nextAnnounce(t, pres, "rec-1", false)
			if n := fr.asked.Load(); n != 1 {
				t.Errorf("recovery asked %d times, want 1", n)
			}
			r.cancel()
			r.wait(t, 10*time.Second)
			for len(pres) > 0 {
				<-pres
			}
		})
		t.Run(tc.name+", not allowed", func(t *testing.T) {
			var dials atomic.Int32
			fr := &fakeRenewer{token: tc.token, expires: tc.expires, recover: func() (string, time.Time, error) {
				return "", time.Time{}, &agentid.RefusedError{Op: "recovery",
					API: &protocol.APIError{Code: protocol.APINoRecovery, Message: "no recovery allowed for rec-1"}}
			}}
			jwtFn := func() (string, error) { dials.Add(1); return fr.JWT() }
			var log lockedBuffer
			r := startAgent(t, f.ns, Config{Name: "rec-1", Credentials: Credentials{JWT: jwtFn, Seed: seed}, Renewer: fr,
				ReconnectMin: 10 * time.Millisecond, ReconnectMax: 20 * time.Millisecond},
				func(a *Agent) { a.log = slog.New(slog.NewTextHandler(&log, nil)) })
			waitFor(t, 20*time.Second, "five connection attempts", func() bool { return dials.Load() >= 6 })
			r.cancel()
			r.wait(t, 10*time.Second)
			if n := fr.asked.Load(); n != 1 {
				t.Errorf("recovery asked %d times over %d connection attempts, want once", n, dials.Load())
			}
			if out := log.String(); strings.Count(out, "recovery not allowed: run fleet-agent join with a new token") != 1 {
				t.Errorf("the log does not say once to join again:\n%s", out)
			}
		})
	}
}

// earlyRenewer is a credential due for renewal whose first renewals the
// gateway refuses as too early (this host's clock runs ahead of the
// gateway's); a later one succeeds.
type earlyRenewer struct {
	mu      sync.Mutex
	token   string
	refuse  int
	calls   int
	issued  time.Time
	expires time.Time
}

func (e *earlyRenewer) JWT() (string, error) { return e.token, nil }

func (e *earlyRenewer) Validity() (time.Time, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.issued, e.expires
}

func (e *earlyRenewer) Renew(context.Context, func(context.Context, string, []byte) ([]byte, error)) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls++
	if e.calls <= e.refuse {
		return &agentid.RefusedError{Op: "renewal", API: &protocol.APIError{Code: protocol.APITooEarly, Message: "renewed once past half its life"}}
	}
	e.issued, e.expires = time.Now(), time.Now().Add(3*time.Hour)
	return nil
}

func (e *earlyRenewer) Recover(context.Context) error { return nil }

func (e *earlyRenewer) renewals() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls
}

// A renewal the gateway refuses as too early does not wedge the agent:
// it keeps its credential and asks again after its backoff, until one
// succeeds; reconnects meanwhile do not hurry the next request (the
// gateway bounds each host's renewals).
func TestEarlyRenewalRetried(t *testing.T) {
	f := startOperatorNATS(t, protocol.AgentPublishTemplate(), protocol.AgentSubscribeTemplate())
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	er := &earlyRenewer{token: f.agentJWT(t, kp, "early-1", time.Now().Add(time.Hour)), refuse: 2,
		issued: time.Now().Add(-24 * time.Hour), expires: time.Now().Add(time.Hour)}
	r := startAgent(t, f.ns, Config{Name: "early-1", Credentials: Credentials{JWT: er.JWT, Seed: seed}, Renewer: er},
		func(a *Agent) { a.renewRetry = 2 * time.Second })
	waitFor(t, 20*time.Second, "the first renewal", func() bool { return er.renewals() >= 1 })
	// Reconnects within the backoff (1 to 2 s after the first refusal).
	for range 20 {
		r.a.signalJoined()
		time.Sleep(20 * time.Millisecond)
	}
	if n := er.renewals(); n != 1 {
		t.Errorf("%d renewals asked within the backoff after a refusal, want 1", n)
	}
	waitFor(t, 30*time.Second, "a renewal that succeeds", func() bool { return er.renewals() >= 3 })
	if _, expires := er.Validity(); time.Until(expires) < 2*time.Hour {
		t.Error("the credential was not renewed after the early refusals")
	}
}
