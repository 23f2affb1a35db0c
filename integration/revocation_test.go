package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// TestRevokeAgent: revoking a host closes its live connection within a
// second, refuses it from then on, shows it revoked and refuses calls to
// it; no credential is issued again for its key, nor for its name but by
// a replacing enrolment, which revokes nothing else.
func TestRevokeAgent(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"keeper", "victim"}})
	creds, seed := env.Enrol("victim")
	live := watchConn(t, env.NATSURL(), creds.JWT, seed, creds.CAPEM)
	keeperCreds, keeperSeed := env.Enrol("keeper")
	keeper := watchConn(t, env.NATSURL(), keeperCreds.JWT, keeperSeed, keeperCreds.CAPEM)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	if err := env.Gateway.RevokeAgent(ctx, "victim", "ops@example.com"); err != nil {
		t.Fatal(err)
	}
	revoked := time.Since(start)
	took := live.WaitCut(t, 5*time.Second).Sub(start)
	t.Logf("RevokeAgent returned after %s; the live connection was closed %s after the call", revoked.Round(time.Microsecond), took.Round(time.Microsecond))
	if took > time.Second {
		t.Errorf("the connection was closed %s after RevokeAgent; want within 1s", took)
	}
	live.WaitErr(t, "the server to say the credential was revoked", func(err error) bool { return errors.Is(err, nats.ErrAuthRevoked) })
	// Its attempts to come back are refused; the other agent is left alone.
	live.WaitErr(t, "a refused reconnect", func(err error) bool { return errors.Is(err, nats.ErrAuthorization) })
	if live.nc.IsConnected() {
		t.Error("the revoked credential is connected again")
	}
	if nc, err := nats.Connect(env.NATSURL(), nats.UserJWTAndSeed(creds.JWT, string(seed))); err == nil {
		nc.Close()
		t.Error("a new connection with the revoked credential was admitted")
	}
	if !keeper.nc.IsConnected() {
		t.Error("revoking victim cut keeper off")
	}

	// The gateway: victim is listed as revoked and never routed to.
	env.WaitHost("victim", false)
	cs := env.Client("", nil)
	if out := mustOK(t, call(t, cs, "hosts", nil)); !strings.Contains(out, "victim\trevoked") {
		t.Errorf("hosts does not show victim revoked:\n%s", out)
	}
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "victim", "command": "true"}), "revoked")

	// Never issued again: not for the key, not for the name.
	pub := publicOf(t, seed)
	if _, err := env.Gateway.EnrolLocal(ctx, "victim", pub, nil); !errors.Is(err, gateway.ErrHostRevoked) {
		t.Errorf("re-enrolling victim's key: %v; want ErrHostRevoked", err)
	}
	if _, err := env.Gateway.EnrolLocal(ctx, "victim-2", pub, nil); !errors.Is(err, gateway.ErrKeyRevoked) {
		t.Errorf("enrolling victim's key under another name: %v; want ErrKeyRevoked", err)
	}
	if _, _, err := enrolKey(t, env.Gateway, "victim"); !errors.Is(err, gateway.ErrHostRevoked) || !strings.Contains(err.Error(), "--replace victim") {
		t.Errorf("enrolling the name victim with a new key: %v; want ErrHostRevoked naming --replace", err)
	}
	if err := env.Gateway.RevokeAgent(ctx, "victim", "again"); err != nil {
		t.Errorf("revoking a revoked host again: %v", err)
	}
	if rec, _ := env.Gateway.Agent(ctx, "victim"); rec.RevokedBy != "ops@example.com" || rec.PublicKey != pub {
		t.Errorf("record after revoking twice: %+v", rec)
	}
	if err := env.Gateway.RevokeAgent(ctx, "nobody", "ops"); !errors.Is(err, gateway.ErrUnknownAgent) {
		t.Errorf("revoking an unknown host: %v", err)
	}

	// A replacing enrolment takes the name with a new key; the old key
	// stays revoked.
	fresh, freshSeed, err := enrolKey(t, env.Gateway, "victim", gateway.ReplaceHost())
	if err != nil {
		t.Fatalf("replacing victim: %v", err)
	}
	if nc, err := nats.Connect(env.NATSURL(), nats.UserJWTAndSeed(fresh.JWT, string(freshSeed))); err != nil {
		t.Errorf("the replacing key's credential: %v", err)
	} else {
		nc.Close()
	}
	if nc, err := nats.Connect(env.NATSURL(), nats.UserJWTAndSeed(creds.JWT, string(seed))); err == nil {
		nc.Close()
		t.Error("the replaced key's credential was admitted")
	}
	if _, err := env.Gateway.EnrolLocal(ctx, "victim", pub, nil, gateway.ReplaceHost()); !errors.Is(err, gateway.ErrKeyRevoked) {
		t.Errorf("taking the name back with the revoked key: %v; want ErrKeyRevoked", err)
	}
}

// TestReplaceActiveHostRevokesOldKey: a replacing enrolment of a host
// that is not revoked revokes the key it had, at once.
func TestReplaceActiveHostRevokesOldKey(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	old, oldSeed, err := enrolKey(t, env.Gateway, "web-1")
	if err != nil {
		t.Fatal(err)
	}
	live := watchConn(t, env.NATSURL(), old.JWT, oldSeed, nil)
	if _, _, err := enrolKey(t, env.Gateway, "web-1"); !errors.Is(err, gateway.ErrNameTaken) {
		t.Fatalf("a second key for web-1: %v; want ErrNameTaken", err)
	}
	if !live.nc.IsConnected() {
		t.Fatal("a refused enrolment cut the holder of the name off")
	}
	start := time.Now()
	if _, _, err := enrolKey(t, env.Gateway, "web-1", gateway.ReplaceHost()); err != nil {
		t.Fatal(err)
	}
	at := live.WaitCut(t, 5*time.Second)
	t.Logf("the replaced key's connection was closed %s after the replacing enrolment began", at.Sub(start).Round(time.Microsecond))
}

func publicOf(t *testing.T, seed []byte) string {
	t.Helper()
	kp, err := nkeys.FromSeed(seed)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	return pub
}

// TestRevocationSurvivesGatewayRestart: the embedded server of a
// restarted gateway still refuses a revoked credential (the account JWT
// the gateway keeps in its data directory, and the agent records), and
// still admits the others.
func TestRevocationSurvivesGatewayRestart(t *testing.T) {
	dir := t.TempDir()
	cfg := gatewayConfig(t, dir)
	gw, err := gateway.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	victim, victimSeed, err := enrolKey(t, gw, "victim")
	if err != nil {
		t.Fatal(err)
	}
	kept, keptSeed, err := enrolKey(t, gw, "kept")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := gw.RevokeAgent(ctx, "victim", "ops"); err != nil {
		t.Fatal(err)
	}
	if err := gw.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	saved, err := os.ReadFile(filepath.Join(dir, "nats", "account.jwt"))
	if err != nil {
		t.Fatal(err)
	}
	ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(saved)))
	if err != nil || !ac.IsClaimRevoked(userClaims(t, victim.JWT)) {
		t.Fatalf("the saved account JWT does not revoke victim (%v)", err)
	}

	gw, err = gateway.Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Shutdown(ctx)
	if nc, err := nats.Connect(gw.NATSURL(), nats.UserJWTAndSeed(victim.JWT, string(victimSeed))); err == nil {
		nc.Close()
		t.Error("the restarted gateway's server admitted the revoked credential")
	}
	nc, err := nats.Connect(gw.NATSURL(), nats.UserJWTAndSeed(kept.JWT, string(keptSeed)))
	if err != nil {
		t.Fatalf("the restarted gateway's server refused a credential issued before the restart: %v", err)
	}
	nc.Close()
	if _, _, err := enrolKey(t, gw, "victim"); !errors.Is(err, gateway.ErrHostRevoked) {
		t.Errorf("enrolling victim after the restart: %v; want ErrHostRevoked", err)
	}
}

func userClaims(t *testing.T, token string) *jwt.UserClaims {
	t.Helper()
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

// TestCredentialExpiry: a credential is good until it expires; then the
// server closes the connection and refuses the credential.
func TestCredentialExpiry(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.AgentCredentialTTL = 2 * time.Second }})
	creds, seed, err := enrolKey(t, env.Gateway, "brief")
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(creds.Expires); d > 2*time.Second || d < 0 {
		t.Fatalf("credential expires in %s; want within the 2s TTL", d)
	}
	live := watchConn(t, env.NATSURL(), creds.JWT, seed, nil)
	late := live.WaitCut(t, 10*time.Second).Sub(creds.Expires)
	t.Logf("closed %s after the credential's expiry", late.Round(time.Millisecond))
	// The server counts a credential's validity in whole seconds.
	if late < 0 || late > time.Second {
		t.Errorf("closed %s after expiry; want within a second of it", late)
	}
	live.WaitErr(t, "the server to say the credential expired", func(err error) bool { return errors.Is(err, nats.ErrAuthExpired) })
	// Once the second of its expiry has passed, it is refused outright.
	time.Sleep(time.Until(creds.Expires.Add(1100 * time.Millisecond)))
	if nc, err := nats.Connect(env.NATSURL(), nats.UserJWTAndSeed(creds.JWT, string(seed))); err == nil {
		nc.Close()
		t.Error("an expired credential was admitted")
	}
}

// TestRevocationsConvergeAcrossReplicas: two gateway replicas revoking
// different hosts at the same moment both take effect: each re-reads
// the records after its push, and pushes again when the other's
// revocation crossed it.
func TestRevocationsConvergeAcrossReplicas(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{}})
	gw2 := env.StartGateway(nil)
	const pairs = 4
	type victim struct {
		host string
		w    *watchedConn
	}
	var victims []victim
	for i := range 2 * pairs {
		host := fmt.Sprintf("v-%d", i)
		creds, seed, err := enrolKey(t, env.Gateway, host)
		if err != nil {
			t.Fatal(err)
		}
		victims = append(victims, victim{host, watchConn(t, env.NATSURL(), creds.JWT, seed, nil)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < len(victims); i += 2 {
		var wg sync.WaitGroup
		errs := make(chan error, 2)
		for j, gw := range []*gateway.Gateway{env.Gateway, gw2} {
			wg.Go(func() { errs <- gw.RevokeAgent(ctx, victims[i+j].host, "ops") })
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, v := range victims {
		v.w.WaitCut(t, 10*time.Second)
	}
	// What the server holds now revokes them all.
	sys, err := nats.Connect(env.NATSURL(), nats.UserCredentials(filepath.Join(env.setup, gateway.NATSSetupFiles.SystemCreds)))
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	ac := lookupAccountJWT(t, sys, readPub(t, env.setup, gateway.NATSSetupFiles.AccountJWT))
	if len(ac.Revocations) != len(victims) {
		t.Errorf("the account JWT has %d revocations, want %d", len(ac.Revocations), len(victims))
	}
}

// lookupAccountJWT asks the servers for an account's JWT.
func lookupAccountJWT(t *testing.T, sys *nats.Conn, account string) *jwt.AccountClaims {
	t.Helper()
	m, err := sys.Request("$SYS.REQ.ACCOUNT."+account+".CLAIMS.LOOKUP", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := jwt.DecodeAccountClaims(string(m.Data))
	if err != nil {
		t.Fatal(err)
	}
	return ac
}

// TestStaleClaimsReconciled: a NATS server that comes back without the
// revocations (its resolver directory lost, only the preloaded account
// JWT left) gets them again from the gateway as soon as the gateway
// reconnects.
func TestStaleClaimsReconciled(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{}})
	creds, seed, err := enrolKey(t, env.Gateway, "victim")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := env.Gateway.RevokeAgent(ctx, "victim", "ops"); err != nil {
		t.Fatal(err)
	}
	env.StopNATS()
	if err := os.RemoveAll(filepath.Join(env.natsDir, "jwt")); err != nil {
		t.Fatal(err)
	}
	env.startNATS()
	waitFor(t, 20*time.Second, "the gateway to push the revocations to the restarted server", func() bool {
		nc, err := nats.Connect(env.NATSURL(), nats.UserJWTAndSeed(creds.JWT, string(seed)))
		if err == nil {
			nc.Close()
			return false
		}
		return true
	})
	// And it stays so: the refusal was the pushed account JWT's, not a
	// server still starting up.
	for range 5 {
		if nc, err := nats.Connect(env.NATSURL(), nats.UserJWTAndSeed(creds.JWT, string(seed))); err == nil {
			nc.Close()
			t.Fatal("the revoked credential was admitted again")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRevocationOnCluster: on a 3-node cluster configured from
// deploy/nats/cluster-node.conf (TLS on clients and routes, the full
// resolver), revoking a host closes its connections on every node within
// a second, the gateway being connected to one node only.
func TestRevocationOnCluster(t *testing.T) {
	dir := t.TempDir()
	clients := []int{freePort(t), freePort(t), freePort(t)}
	routes := []int{freePort(t), freePort(t), freePort(t)}
	var nodes []string
	for i := range 3 {
		nodes = append(nodes, clusterNodeConf(t, dir, fmt.Sprintf("n%d", i+1), clients[i], routes[i], routes))
	}
	var wg sync.WaitGroup
	for _, conf := range nodes {
		wg.Go(func() { startNode(t, conf) })
	}
	wg.Wait()
	url := func(i int) string { return fmt.Sprintf("tls://127.0.0.1:%d", clients[i]) }
	ca := filepath.Join(dir, "tls", "ca.pem")
	env := NewEnv(t, Options{Agents: []string{}, ServerURL: url(0), ServerSetup: filepath.Join(dir, "setup"),
		Gateway: func(c *gateway.Config) { c.NATSCAFile = ca }})

	type member struct {
		node int
		w    *watchedConn
	}
	var victims, keepers []member
	for i, node := range []int{1, 2, 1, 2} {
		creds, seed, err := enrolKey(t, env.Gateway, fmt.Sprintf("host-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if len(creds.CAPEM) == 0 {
			t.Fatal("enrolment gave no CA for the cluster's TLS certificates")
		}
		m := member{node, watchConn(t, url(node), creds.JWT, seed, creds.CAPEM)}
		if i < 2 {
			victims = append(victims, m)
		} else {
			keepers = append(keepers, m)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	for i := range victims {
		if err := env.Gateway.RevokeAgent(ctx, fmt.Sprintf("host-%d", i), "ops"); err != nil {
			t.Fatal(err)
		}
	}
	for i, v := range victims {
		took := v.w.WaitCut(t, 5*time.Second).Sub(start)
		t.Logf("host-%d on node n%d: closed %s after the first revocation began", i, v.node+1, took.Round(time.Microsecond))
		if took > time.Second {
			t.Errorf("host-%d on node n%d was closed %s after its revocation; want within 1s", i, v.node+1, took)
		}
		v.w.WaitErr(t, "a refused reconnect", func(err error) bool { return errors.Is(err, nats.ErrAuthorization) })
	}
	for i, k := range keepers {
		if !k.w.nc.IsConnected() {
			t.Errorf("host-%d on node n%d, not revoked, was cut off", i+2, k.node+1)
		}
	}
}
