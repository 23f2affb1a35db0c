package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// natsUserFromSeed connects as a new user minted with the account seed in
// path, as someone who copied that file would: unrestricted when it is an
// account's own key, with issuerAccount set when it is a signing key of
// that account (a scoped key's template then decides).
func natsUserFromSeed(t *testing.T, url, path, issuerAccount, name string) *nats.Conn {
	t.Helper()
	nc := rogueUser(t, url, path, issuerAccount, name)
	if nc == nil {
		t.Fatalf("the server refused a user minted with %s", filepath.Base(path))
	}
	return nc
}

// eraseAttempts are the JetStream API requests that would erase or cut
// the audit trail, with their bodies.
func eraseAttempts(t *testing.T, cfg []byte) map[string][]byte {
	t.Helper()
	var sc map[string]any
	if err := json.Unmarshal(cfg, &sc); err != nil {
		t.Fatal(err)
	}
	sc["max_msgs"] = 1
	sc["deny_delete"], sc["deny_purge"] = false, false
	update, _ := json.Marshal(sc)
	s := protocol.AuditStream
	return map[string][]byte{
		"$JS.API.STREAM.UPDATE." + s:     update,
		"$JS.API.STREAM.DELETE." + s:     nil,
		"$JS.API.STREAM.PURGE." + s:      []byte(`{}`),
		"$JS.API.STREAM.MSG.DELETE." + s: []byte(`{"seq":1,"no_erase":true}`),
	}
}

// tryErase sends each attempt as nc and fails the test for each one a
// JetStream server carried out.
func tryErase(t *testing.T, who string, nc *nats.Conn, attempts map[string][]byte) {
	t.Helper()
	// All at once: each one the server drops waits out its timeout.
	var wg sync.WaitGroup
	var mu sync.Mutex
	var done []string
	for subj, body := range attempts {
		wg.Go(func() {
			msg, err := nc.Request(subj, body, 1500*time.Millisecond)
			if err != nil {
				return // no answer: the server dropped a publish it does not permit
			}
			var resp struct {
				Error *struct {
					Description string `json:"description"`
				} `json:"error"`
			}
			if json.Unmarshal(msg.Data, &resp) == nil && resp.Error != nil {
				return
			}
			mu.Lock()
			done = append(done, fmt.Sprintf("%s was carried out: %.300s", subj, msg.Data))
			mu.Unlock()
		})
	}
	wg.Wait()
	for _, d := range done {
		t.Errorf("as a user made with %s, %s", who, d)
	}
}

// What the running gateways hold (their users' creds, the system
// user's creds, the agent signing key) cannot delete, cut, reconfigure or
// purge the audit trail: the records stay, the chain verifies whole.
func TestAuditTrailRuntimeCredentialsCannotErase(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{"alpha"}})
	cs := env.Client("", nil)
	for i := range 6 {
		mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": fmt.Sprintf("echo record %d", i)}))
	}
	files := gateway.NATSSetupFiles
	gwCreds := filepath.Join(env.setup, files.GatewayCreds)
	gw, err := nats.Connect(env.NATSURL(), nats.UserCredentials(gwCreds), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	info, err := gw.Request("$JS.API.STREAM.INFO."+protocol.AuditStream, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var si struct {
		Config json.RawMessage `json:"config"`
		State  struct {
			Msgs uint64 `json:"messages"`
		} `json:"state"`
	}
	if err := json.Unmarshal(info.Data, &si); err != nil || si.State.Msgs < 6 {
		t.Fatalf("stream info %s: %v", info.Data, err)
	}
	attempts := eraseAttempts(t, si.Config)
	tryErase(t, files.GatewayCreds, gw, attempts)

	accountPub := issuerAccountOf(t, gwCreds)
	agent := natsUserFromSeed(t, env.NATSURL(), filepath.Join(env.setup, files.AgentSigningKey), accountPub, "alpha")
	tryErase(t, files.AgentSigningKey, agent, attempts)
	// The buckets whose rollback would bring back a spent join token or
	// an agent record from before its revocation are kept the same way
	// (TestBucketRollbackRefusedToRuntimeCreds tries a restore too).
	for _, stream := range []string{"KV_fleet_tokens", "KV_" + protocol.AgentsBucket} {
		info, err := gw.Request("$JS.API.STREAM.INFO."+stream, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var bi struct {
			Config json.RawMessage `json:"config"`
		}
		if err := json.Unmarshal(info.Data, &bi); err != nil {
			t.Fatal(err)
		}
		tryErase(t, files.GatewayCreds, gw, rollbackAttempts(t, stream, bi.Config))
		tryErase(t, files.AgentSigningKey, agent, rollbackAttempts(t, stream, bi.Config))
	}

	sys, err := nats.Connect(env.NATSURL(), nats.UserCredentials(filepath.Join(env.setup, files.SystemCreds)), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	tryErase(t, files.SystemCreds, sys, map[string][]byte{"$JS.API.ACCOUNT.PURGE." + accountPub: nil})

	res := call(t, cs, "audit", map[string]any{"verify": true, "limit": 500})
	out := mustOK(t, res)
	page := structured(t, res)
	chain, _ := page["chain"].(map[string]any)
	if chain["intact"] != true || chain["records"].(float64) < 6 || !strings.Contains(out, "chain: INTACT") {
		t.Fatalf("after the attempts the chain does not verify: %v\n%s", chain, out)
	}
	if n := len(page["records"].([]any)); n < 6 {
		t.Fatalf("%d records left, want at least 6:\n%s", n, out)
	}
}

// issuerAccountOf returns the account of the user in a creds file.
func issuerAccountOf(t *testing.T, creds string) string {
	t.Helper()
	uc := credsClaims(t, creds)
	if uc.IssuerAccount != "" {
		return uc.IssuerAccount
	}
	return uc.Issuer
}

// credsClaims returns the claims of the user in a creds file.
func credsClaims(t *testing.T, creds string) *jwt.UserClaims {
	t.Helper()
	data, err := os.ReadFile(creds)
	if err != nil {
		t.Fatal(err)
	}
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	return uc
}

// Damage done with what no running gateway holds (here the fleet
// account's key of an external cluster's setup, which is kept offline:
// README, Audit) is seen within 10 s, recorded as a gap, counted, shown
// on /readyz, and the gateway goes on serving calls without a restart:
// the stream cut to one record, then deleted.
func TestAuditDamageDetected(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{"alpha"}, Gateway: func(c *gateway.Config) { c.Metrics = true }})
	cs := env.Client("", nil)
	for i := range 6 {
		mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": fmt.Sprintf("echo record %d", i)}))
	}
	base := strings.TrimSuffix(env.Gateway.MCPURL(), "/mcp")
	rogue := natsUserFromSeed(t, env.NATSURL(), filepath.Join(env.setup, gateway.NATSSetupFiles.AccountKey), "", "leaked")
	js, err := jetstream.New(rogue)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The watcher reads the stream every 2 s and shows nothing of what it
	// read: a period and a half on, it has read the stream with its
	// records, so the cut below is measured against them.
	time.Sleep(2500 * time.Millisecond)
	s, err := js.Stream(ctx, protocol.AuditStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs = 1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	damage := func(n float64) func() bool {
		return func() bool { return scrape(t, base+"/metrics")["fleet_audit_damage_total"] >= n }
	}
	waitFor(t, 10*time.Second, "fleet_audit_damage_total to count the cut", damage(1))
	t.Logf("the cut was counted after %s", time.Since(cut).Round(time.Millisecond))
	code, body := get(t, base+"/readyz")
	if code != 200 || !strings.HasPrefix(body, "ready\n") || !strings.Contains(body, "audit trail damaged") || !strings.Contains(body, "max_msgs 1") ||
		!strings.Contains(body, "put it back with an admin credential") {
		t.Fatalf("/readyz after the cut: %d %q", code, body)
	}
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo after the cut"}))
	// The gateway's creds may not update the stream: the operator puts
	// it back with the admin credential, as /readyz says.
	cfg.MaxMsgs = -1
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}

	before := scrape(t, base+"/metrics")["fleet_audit_damage_total"]
	if err := js.DeleteStream(ctx, protocol.AuditStream); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	waitFor(t, 10*time.Second, "fleet_audit_damage_total to count the deletion", damage(before+1))
	if _, body := get(t, base+"/readyz"); !strings.Contains(body, "the audit stream was deleted") {
		t.Errorf("/readyz after the deletion: %q", body)
	}
	t.Logf("the deletion was counted after %s", time.Since(deleted).Round(time.Millisecond))
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo after the deletion"}))
	if time.Since(deleted) > 10*time.Second {
		t.Errorf("a call after the deletion was answered only %s after it", time.Since(deleted))
	}
	res := call(t, cs, "audit", map[string]any{"verify": true})
	out := mustOK(t, res)
	chain, _ := structured(t, res)["chain"].(map[string]any)
	if chain["intact"] != false || !strings.Contains(out, "chain: BROKEN") || !strings.Contains(out, "recorded_gap") || !strings.Contains(out, "the audit stream was deleted; lost sequences") {
		t.Fatalf("verify after the deletion:\n%s", out)
	}
	if !strings.Contains(out, "after the deletion") {
		t.Errorf("the call after the deletion is not in the trail:\n%s", out)
	}
}
