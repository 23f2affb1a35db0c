//go:build unix

package agent

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// opFleet is a NATS server in operator mode, as the gateway runs one: an
// account with a scoped signing key for agents whose template gives
// pub/sub.
type opFleet struct {
	ns      *server.Server
	account nkeys.KeyPair
	signer  nkeys.KeyPair
}

func startOperatorNATS(t *testing.T, pub, sub []string) *opFleet {
	t.Helper()
	return startOperatorNATSWith(t, pub, sub, false)
}

// startOperatorNATSWith is startOperatorNATS, with JetStream on (for the
// account too, and a system account as JetStream needs) when js.
func startOperatorNATSWith(t *testing.T, pub, sub []string, js bool) *opFleet {
	t.Helper()
	op, _ := nkeys.CreateOperator()
	acc, _ := nkeys.CreateAccount()
	signer, _ := nkeys.CreateAccount()
	sys, _ := nkeys.CreateAccount()
	opPub, _ := op.PublicKey()
	accPub, _ := acc.PublicKey()
	signerPub, _ := signer.PublicKey()
	sysPub, _ := sys.PublicKey()
	oc := jwt.NewOperatorClaims(opPub)
	if js {
		oc.SystemAccount = sysPub
	}
	opJWT, _ := oc.Encode(op)
	opClaims, _ := jwt.DecodeOperatorClaims(opJWT)
	ac := jwt.NewAccountClaims(accPub)
	if js {
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	}
	scope := jwt.NewUserScope()
	scope.Key = signerPub
	scope.Template.Pub.Allow.Add(pub...)
	scope.Template.Sub.Allow.Add(sub...)
	scope.Template.Resp = &jwt.ResponsePermission{MaxMsgs: -1, Expires: time.Minute}
	ac.SigningKeys.AddScopedSigner(scope)
	accJWT, err := ac.Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	res := &server.MemAccResolver{}
	_ = res.Store(accPub, accJWT)
	ns := startTestNATSWith(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{opClaims}
		o.AccountResolver = res
		if js {
			sysJWT, _ := jwt.NewAccountClaims(sysPub).Encode(op)
			_ = res.Store(sysPub, sysJWT)
			o.SystemAccount = sysPub
			o.JetStream = true
			o.StoreDir = t.TempDir()
		}
	})
	return &opFleet{ns: ns, account: acc, signer: signer}
}

// agentJWT issues host's credential for a new key, valid until expires.
func (f *opFleet) agentJWT(t *testing.T, kp nkeys.KeyPair, host string, expires time.Time) string {
	t.Helper()
	pub, _ := kp.PublicKey()
	accPub, _ := f.account.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = host
	uc.IssuerAccount = accPub
	uc.Expires = expires.Unix()
	uc.UserPermissionLimits = jwt.UserPermissionLimits{}
	token, err := uc.Encode(f.signer)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// credentials returns host's credentials for a new key.
func (f *opFleet) credentials(t *testing.T, host string, expires time.Time) Credentials {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	token := f.agentJWT(t, kp, host, expires)
	return Credentials{JWT: func() (string, error) { return token, nil }, Seed: seed}
}

// watcher connects an unrestricted user of the account.
func (f *opFleet) watcher(t *testing.T) *nats.Conn {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	token, _ := jwt.NewUserClaims(pub).Encode(f.account)
	seed, _ := kp.Seed()
	nc, err := nats.Connect(f.ns.ClientURL(), nats.UserJWTAndSeed(token, string(seed)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// An agent refuses, at New, a credential issued for another host or for
// another key: it says so plainly instead of joining under a name NATS
// gives it no subjects for.
func TestNewRefusesCredentialsNotItsOwn(t *testing.T) {
	f := startOperatorNATS(t, protocol.AgentPublishTemplate(), protocol.AgentSubscribeTemplate())
	web1 := f.credentials(t, "web-1", time.Now().Add(time.Hour))
	other := f.credentials(t, "web-2", time.Now().Add(time.Hour))
	for _, tc := range []struct {
		name  string
		creds Credentials
		want  []string
	}{
		{"another host's", web1, []string{`named "web-2"`, `credential is for host "web-1"`, "--name web-1"}},
		{"another key's", Credentials{JWT: other.JWT, Seed: web1.Seed}, []string{"issued for key", "not for the agent's key"}},
		{"no seed", Credentials{JWT: other.JWT}, []string{"both the user JWT and the seed"}},
		{"a seed that is no user key", Credentials{JWT: other.JWT, Seed: []byte("SAAL")}, []string{"NATS key"}},
		{"a CA that is no PEM", Credentials{JWT: other.JWT, Seed: other.Seed, CA: []byte("nope")}, []string{"CA certificate is not PEM"}},
	} {
		_, err := New(Config{Servers: []string{f.ns.ClientURL()}, Name: "web-2", Credentials: tc.creds,
			StateDir: t.TempDir(), Cwd: t.TempDir(), Logger: quietLogger()})
		if err == nil {
			t.Errorf("%s: New accepted it", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tc.name, err, w)
			}
		}
	}
}

// An agent whose credential NATS does not give its host's subjects (the
// servers' agent template is not the fleet's) stops at start and says
// why; it never announces.
func TestRunStopsWhenNATSRefusesTheHost(t *testing.T) {
	// A template that lets agents announce but not hear their calls.
	f := startOperatorNATS(t, protocol.AgentPublishTemplate(), []string{protocol.DiscoverSubject()})
	watcher := f.watcher(t)
	announces, err := watcher.SubscribeSync(protocol.PresenceWildcard())
	if err != nil {
		t.Fatal(err)
	}
	_ = watcher.Flush()
	a, err := New(Config{Servers: []string{f.ns.ClientURL()}, Name: "web-1", Credentials: f.credentials(t, "web-1", time.Now().Add(time.Hour)),
		StateDir: t.TempDir(), Cwd: t.TempDir(), Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run kept going with a credential NATS refuses the host's subjects")
	}
	var refused *JoinRefusedError
	if !errors.As(err, &refused) || !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("Run = %v, want a JoinRefusedError", err)
	}
	for _, w := range []string{`NATS refused host "web-1" its own subjects`, `NATS user "web-1"`, "agent signing key"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not mention %q", err, w)
		}
	}
	if m, err := announces.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("the refused agent was announced: %s %s", m.Subject, m.Data)
	}
}

// The agent asks for its credential at every connect: one renewed while
// it runs is used from the next connection on. Here the first expires
// after two seconds, the server disconnects the agent, and the NATS
// client's own reconnect (not a new connection after it gave up) brings
// it back with the second.
func TestCredentialReadAtEveryConnect(t *testing.T) {
	f := startOperatorNATS(t, protocol.AgentPublishTemplate(), protocol.AgentSubscribeTemplate())
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	short := f.agentJWT(t, kp, "renew-1", time.Now().Add(2*time.Second))
	long := f.agentJWT(t, kp, "renew-1", time.Now().Add(time.Hour))
	var current atomic.Value
	current.Store(short)
	var calls atomic.Int32
	creds := Credentials{JWT: func() (string, error) { calls.Add(1); return current.Load().(string), nil }, Seed: seed}
	pres := presence(t, f.watcher(t))
	var log lockedBuffer
	r := startAgent(t, f.ns, Config{Name: "renew-1", Credentials: creds, Heartbeat: 200 * time.Millisecond,
		ReconnectMin: 10 * time.Millisecond, ReconnectMax: 100 * time.Millisecond},
		func(a *Agent) { a.log = slog.New(slog.NewTextHandler(&log, nil)) })
	defer func() { r.cancel(); r.wait(t, 10*time.Second) }()
	nextAnnounce(t, pres, "renew-1", false)
	before := calls.Load()
	current.Store(long) // renewed
	// The server ends the connection when the first credential expires;
	// the agent connects again, asking for its credential.
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() <= before {
		if time.Now().After(deadline) {
			t.Fatal("the agent never asked for its credential again after the first one expired")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And it is back in the fleet with the renewed one (an expired
	// credential is refused): announces come again.
	for len(pres) > 0 {
		<-pres
	}
	nextAnnounce(t, pres, "renew-1", false)
	if out := log.String(); strings.Contains(out, "connection closed") || !strings.Contains(out, "NATS reconnected") {
		t.Errorf("the agent did not come back through the NATS client's reconnect:\n%s", out)
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger and a test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
