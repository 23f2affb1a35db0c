//go:build unix

package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// The credential's life end to end, with the real fleet-agent binary and
// the real gateway: renewal over NATS before it expires, recovery over
// the fleet API after it has (only when the operator allowed one), and
// a revoked host that never gets a credential again.

// credentialEnv is a gateway with the fleet API and credentials that
// live ttl, and a host joined to it (the identity in stateDir).
type credentialEnv struct {
	*Env
	host, stateDir, dir string
}

func newCredentialEnv(t *testing.T, ttl time.Duration) *credentialEnv {
	t.Helper()
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) {
		c.APIListen, c.AgentCredentialTTL = "127.0.0.1:0", ttl
	}})
	ce := &credentialEnv{Env: env, host: "web-1", dir: t.TempDir()}
	ce.stateDir = filepath.Join(ce.dir, ".state")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tok, err := env.Gateway.CreateJoinToken(ctx, &protocol.TokenCreateRequest{Name: ce.host}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := identity.Join(ctx, identity.JoinOptions{GatewayURL: env.Gateway.APIURL(), Token: tok.Token, CAPin: tok.CAPin, StateDir: ce.stateDir}); err != nil {
		t.Fatalf("join: %v", err)
	}
	return ce
}

// agentProc is a running fleet-agent process and its log.
type agentProc struct {
	cmd  *exec.Cmd
	done <-chan struct{}
	log  *syncBuffer
}

// start runs fleet-agent on the host's state directory (no join: the
// identity is there).
func (ce *credentialEnv) start(t *testing.T) *agentProc {
	t.Helper()
	p := &agentProc{log: &syncBuffer{}}
	p.cmd = exec.Command(agentBinary(t), "--state_dir", ce.stateDir, "--cwd", ce.dir, "--heartbeat", "500ms", "--log_level", "info")
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = waitProcess(p.cmd)
	t.Cleanup(func() { p.stop(t) })
	return p
}

// stop ends the process with SIGTERM (and kills it if it does not go).
func (p *agentProc) stop(t *testing.T) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("fleet-agent did not stop within 20 s of SIGTERM")
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitLog waits until the agent logged want.
func (p *agentProc) waitLog(t *testing.T, d time.Duration, want string) {
	t.Helper()
	waitFor(t, d, "the agent to log "+want, func() bool { return strings.Contains(p.log.String(), want) })
}

func (ce *credentialEnv) jwt(t *testing.T) string {
	t.Helper()
	token, err := identity.Open(ce.stateDir).LoadJWT()
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func (ce *credentialEnv) expires(t *testing.T) time.Time {
	t.Helper()
	id, err := identity.Load(ce.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	return id.Expires()
}

// TestAgentRenewsFromGateway: an agent whose credential lives 6 s
// renews it over NATS from the gateway well before it expires, again
// and again, and stays online across every old expiry (the server ends
// a connection whose credential expires; the agent is back with the new
// one at once); calls reach it after.
func TestAgentRenewsFromGateway(t *testing.T) {
	ce := newCredentialEnv(t, 6*time.Second)
	first := ce.jwt(t)
	expires := ce.expires(t)
	p := ce.start(t)
	ce.WaitHost(ce.host, true)

	// Watch the host's presence until two credentials have expired.
	var mu sync.Mutex
	var offline []time.Time
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if h, ok := ce.Gateway.Host(ce.host); !ok || !h.Online {
				mu.Lock()
				offline = append(offline, time.Now())
				mu.Unlock()
			}
		}
	})
	waitFor(t, 20*time.Second, "a renewed credential on disk", func() bool { return ce.jwt(t) != first })
	renewedAt := time.Now()
	if !renewedAt.Before(expires) {
		t.Errorf("renewed at %s, after the credential expired at %s", renewedAt.Format(time.StampMilli), expires.Format(time.StampMilli))
	}
	second := ce.jwt(t)
	next := ce.expires(t)
	if !next.After(expires) {
		t.Errorf("the renewed credential expires %s, the first %s", next, expires)
	}
	// Past the first expiry and the second's: renewed again in between.
	waitFor(t, 20*time.Second, "the second expiry to pass", func() bool { return time.Now().After(next.Add(time.Second)) })
	if third := ce.jwt(t); third == second || third == first {
		t.Error("the credential was not renewed a second time")
	}
	close(stop)
	watch.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(offline) > 0 {
		t.Errorf("the host was seen offline %d times (first at %s) across the expiries", len(offline), offline[0].Format(time.StampMilli))
	}
	if n := strings.Count(p.log.String(), "credential renewed"); n < 2 {
		t.Errorf("the agent logged %d renewals:\n%s", n, p.log.String())
	}
	cs := ce.Client("", nil)
	if out := mustOK(t, call(t, cs, "bash", map[string]any{"host": ce.host, "command": "echo still-here"})); !strings.Contains(out, "still-here") {
		t.Errorf("bash after the renewals: %s", out)
	}
	if strings.Contains(p.log.String(), "asking the gateway for a recovery") {
		t.Error("the agent needed a recovery: its renewals did not keep it current")
	}
}

// TestAgentRecoversAfterExpiry: an agent that was offline until its
// credential expired is refused a recovery until the operator allows
// one (the host stays offline, the credential on disk unchanged); then a
// restart recovers over the fleet API and the host is back, its one
// recovery spent.
func TestAgentRecoversAfterExpiry(t *testing.T) {
	ce := newCredentialEnv(t, 3*time.Second)
	p := ce.start(t)
	ce.WaitHost(ce.host, true)
	p.stop(t)
	old := ce.jwt(t)
	expires := ce.expires(t)
	waitFor(t, 10*time.Second, "the credential to expire", func() bool { return time.Now().After(expires.Add(500 * time.Millisecond)) })
	ce.WaitHost(ce.host, false)

	p = ce.start(t)
	p.waitLog(t, 30*time.Second, "recovery not allowed")
	if !strings.Contains(p.log.String(), string(protocol.APINoRecovery)) {
		t.Errorf("the refusal does not name %s:\n%s", protocol.APINoRecovery, p.log.String())
	}
	if h, _ := ce.Gateway.Host(ce.host); h.Online {
		t.Error("the host is online without a recovery")
	}
	if ce.jwt(t) != old {
		t.Error("the credential on disk changed without a recovery")
	}
	p.stop(t)

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ce.Gateway.AllowRecovery(ctx, ce.host, 1); err != nil {
		t.Fatal(err)
	}
	p = ce.start(t)
	ce.WaitHost(ce.host, true)
	p.waitLog(t, 10*time.Second, "credential recovered")
	if ce.jwt(t) == old {
		t.Error("online with the old credential")
	}
	rec, err := ce.Gateway.Agent(ctx, ce.host)
	if err != nil {
		t.Fatal(err)
	}
	if rec.RecoveriesLeft != 0 {
		t.Errorf("recoveries left %d after the one allowed was used", rec.RecoveriesLeft)
	}
}

// TestRevokedAgentRestartRefused: a running agent whose host is revoked
// exits by itself with agent.ExitRevoked (which its units do not
// restart), saying once how to enrol again. Restarted anyway, it is
// refused by NATS and asks for a recovery, which the gateway refuses as
// host_revoked: it exits the same way, never with a credential, and the
// host never comes back online.
func TestRevokedAgentRestartRefused(t *testing.T) {
	ce := newCredentialEnv(t, time.Hour)
	p := ce.start(t)
	ce.WaitHost(ce.host, true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ce.Gateway.RevokeAgent(ctx, ce.host, "test"); err != nil {
		t.Fatal(err)
	}
	p.waitExit(t, 20*time.Second, agent.ExitRevoked)
	ce.WaitHost(ce.host, false)
	old := ce.jwt(t)

	p = ce.start(t)
	p.waitExit(t, 30*time.Second, agent.ExitRevoked)
	log := p.log.String()
	if !strings.Contains(log, string(protocol.APIHostRevoked)) {
		t.Errorf("the agent's log does not give the gateway's refusal:\n%s", log)
	}
	if h, _ := ce.Gateway.Host(ce.host); h.Online {
		t.Fatal("the revoked host came back online")
	}
	if ce.jwt(t) != old {
		t.Error("the revoked host's credential on disk changed")
	}
	if strings.Contains(log, "credential recovered") {
		t.Error("the revoked host recovered a credential")
	}
}

// TestRevokedHostReenrolsWithReplaceToken: a revoked host, given a token
// made with --replace NAME, joins again on its old state directory in one
// command (fleet-agent join, no --name, no directory deleted): the join
// asks the gateway with the old key, hears host_revoked, and enrols the
// host under its name with a new key, which comes online.
func TestRevokedHostReenrolsWithReplaceToken(t *testing.T) {
	ce := newCredentialEnv(t, time.Hour)
	old, err := identity.Load(ce.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ce.Gateway.RevokeAgent(ctx, ce.host, "test"); err != nil {
		t.Fatal(err)
	}
	tok, err := ce.Gateway.CreateJoinToken(ctx, &protocol.TokenCreateRequest{Replace: ce.host}, "test")
	if err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(tok.Token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &agentProc{log: &syncBuffer{}}
	p.cmd = exec.Command(agentBinary(t), "join", "--gateway", ce.Gateway.APIURL(), "--token_file", tokenFile, "--ca_pin", tok.CAPin,
		"--state_dir", ce.stateDir, "--cwd", ce.dir, "--heartbeat", "500ms")
	p.cmd.Stderr = p.log
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.done = waitProcess(p.cmd)
	t.Cleanup(func() { p.stop(t) })
	ce.WaitHost(ce.host, true)
	id, err := identity.Load(ce.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	if id.PublicKey == old.PublicKey || id.Enrolment.Host != ce.host {
		t.Errorf("re-enrolled as %q with the old key: %v", id.Enrolment.Host, id.PublicKey == old.PublicKey)
	}
	if log := p.log.String(); !strings.Contains(log, "host_revoked") || !strings.Contains(log, "new key") || strings.Contains(log, "the token was not used") {
		t.Errorf("the join's log:\n%s", log)
	}
}

// waitExit waits for the agent to exit by itself with status code, and
// for its log to say once, and only, how to enrol the host again.
func (p *agentProc) waitExit(t *testing.T, d time.Duration, code int) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("fleet-agent did not exit within %s\n%s", d, p.log.String())
	}
	if got := p.cmd.ProcessState.ExitCode(); got != code {
		t.Errorf("fleet-agent exited with status %d, want %d\n%s", got, code, p.log.String())
	}
	log := p.log.String()
	if n := strings.Count(log, "fleetctl token create --replace"); n != 1 || !strings.Contains(log, "was revoked by the fleet's operator") {
		t.Errorf("the log says %d times how to enrol again, want once:\n%s", n, log)
	}
	for _, other := range []string{"recovery not allowed", "keeps trying", "check --nats"} {
		if strings.Contains(log, other) {
			t.Errorf("the log of the revoked agent also says %q:\n%s", other, log)
		}
	}
}
