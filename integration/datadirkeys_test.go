package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Every key file in an embedded gateway's data directory is tried the
// way someone who copied it would: each account-kind seed as an account
// of its own and as a signing key of the fleet and system accounts; the
// operator key to re-sign the fleet and system accounts with a signing
// key of the attacker's, pushed through a system user. None of them can
// delete, cut, reconfigure or purge the audit trail or the buckets of
// join tokens and agent records: the records stay and the chain
// verifies whole.
func TestAuditTrailDataDirKeysCannotErase(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"alpha"}})
	cs := env.Client("", nil)
	for i := range 6 {
		mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": fmt.Sprintf("echo record %d", i)}))
	}
	dir := filepath.Join(env.gwConfig.DataDir, "nats")
	readPub := func(name string) string {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(bytes.TrimSpace(data))
	}
	accountPub, systemPub := readPub("account.pub"), readPub("system.pub")
	for _, f := range []string{"account.nk", "system.nk"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("the data directory keeps %s, an account's own key", f)
		}
	}
	seeds, err := filepath.Glob(filepath.Join(dir, "*.nk"))
	if err != nil || len(seeds) < 5 {
		t.Fatalf("key files %v: %v", seeds, err)
	}

	attempts := map[string]map[string][]byte{}
	reader := rogueUser(t, env.NATSURL(), filepath.Join(dir, "gateway-signer.nk"), accountPub, "reader")
	if reader == nil {
		t.Fatal("the gateway signing key mints no user: the test cannot read the streams' configuration")
	}
	for _, stream := range []string{protocol.AuditStream, "KV_fleet_tokens", "KV_" + protocol.AgentsBucket, "FLEET_REVOKED"} {
		info, err := reader.Request("$JS.API.STREAM.INFO."+stream, nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var si struct {
			Config json.RawMessage `json:"config"`
		}
		if err := json.Unmarshal(info.Data, &si); err != nil || len(si.Config) == 0 {
			t.Fatalf("stream info of %s: %s %v", stream, info.Data, err)
		}
		attempts[stream] = rollbackAttempts(t, stream, si.Config)
	}
	all := map[string][]byte{"$JS.API.ACCOUNT.PURGE." + accountPub: nil}
	for _, a := range attempts {
		maps.Copy(all, a)
	}
	eraseAll := func(who string, nc *nats.Conn) {
		tryErase(t, who, nc, all)
		// A rollup purges a stream with a plain publish.
		for subj, stream := range map[string]string{"$KV.fleet_agents.rollup": "KV_" + protocol.AgentsBucket, "$KV.fleet_tokens.rollup": "KV_fleet_tokens",
			protocol.AuditSubject(): protocol.AuditStream, protocol.RevokedKeysSubject(): "FLEET_REVOKED"} {
			msg := &nats.Msg{Subject: subj, Header: nats.Header{"Nats-Rollup": []string{"all"}}, Data: []byte("x")}
			if reply, err := nc.RequestMsg(msg, 1500*time.Millisecond); err == nil && !strings.Contains(string(reply.Data), `"error"`) {
				t.Errorf("as a user made with %s, a rollup on %s was taken: %s", who, stream, reply.Data)
			}
		}
	}

	var operator nkeys.KeyPair
	for _, path := range seeds {
		name := filepath.Base(path)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		kp, err := nkeys.FromSeed(bytes.TrimSpace(data))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if pub, _ := kp.PublicKey(); nkeys.IsValidPublicOperatorKey(pub) {
			operator = kp
			continue
		}
		for _, issuer := range []string{"", accountPub, systemPub} {
			if nc := rogueUser(t, env.NATSURL(), path, issuer, "leaked"); nc != nil {
				eraseAll(fmt.Sprintf("%s (issuer account %q)", name, issuer), nc)
			}
		}
	}
	if operator == nil {
		t.Fatal("no operator key in the data directory")
	}

	// The operator key re-signs the fleet and system accounts with a
	// signing key of the attacker's, pushed by a system user made with
	// the system signing key.
	sys := rogueUser(t, env.NATSURL(), filepath.Join(dir, "system-signer.nk"), systemPub, "leaked system")
	if sys == nil {
		t.Fatal("the system signing key mints no user")
	}
	// The system user may publish nothing but what the gateway asks of
	// the servers: not on the raft subjects (on a cluster, an entry there
	// deletes any stream), not a kick or lame duck mode.
	var violations []string
	var vmu sync.Mutex
	sysPerm := rogueUserWith(t, env.NATSURL(), filepath.Join(dir, "system-signer.nk"), systemPub, "leaked system 2", func(_ *nats.Conn, _ *nats.Subscription, err error) {
		vmu.Lock()
		violations = append(violations, err.Error())
		vmu.Unlock()
	})
	forbidden := []string{"$NRG.P._meta_", "$SYS.REQ.SERVER.PING.KICK", "$SYS.REQ.SERVER.PING.LDM", "$JS.API.ACCOUNT.PURGE." + accountPub}
	for _, subj := range forbidden {
		if err := sysPerm.Publish(subj, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the server to refuse the system user's publishes", func() bool {
		_ = sysPerm.Flush()
		vmu.Lock()
		defer vmu.Unlock()
		return len(violations) >= len(forbidden)
	})

	// The operator key revokes every user ("*") and junk keys: the
	// servers take neither (only keys the revoked keys' ledger holds).
	everyone := jwt.NewAccountClaims(accountPub)
	junk, _ := nkeys.CreateUser()
	junkPub, _ := junk.PublicKey()
	everyone.Revocations = jwt.RevocationList{"*": time.Now().Add(50 * 365 * 24 * time.Hour).Unix(), junkPub: time.Now().Unix()}
	allToken, err := everyone.Encode(operator)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sys.Request("$SYS.REQ.ACCOUNT."+accountPub+".CLAIMS.UPDATE", []byte(allToken), 2*time.Second); err != nil {
		t.Logf("the push was not answered: %v", err)
	}
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo after revoking everyone"}))
	if data, err := os.ReadFile(filepath.Join(dir, "account.jwt")); err != nil || strings.Contains(string(data), junkPub) {
		t.Errorf("the saved account JWT: %v", err)
	} else if ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(data))); err != nil || len(ac.Revocations) > 0 {
		t.Errorf("the saved account JWT holds revocations %v (%v)", ac.Revocations, err)
	}

	evil, _ := nkeys.CreateAccount()
	evilPub, _ := evil.PublicKey()
	for _, acct := range []string{accountPub, systemPub} {
		ac := jwt.NewAccountClaims(acct)
		ac.SigningKeys.Add(evilPub)
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: jwt.NoLimit, DiskStorage: jwt.NoLimit, Streams: jwt.NoLimit, Consumer: jwt.NoLimit}
		token, err := ac.Encode(operator)
		if err != nil {
			t.Fatal(err)
		}
		for _, subj := range []string{"$SYS.REQ.ACCOUNT." + acct + ".CLAIMS.UPDATE", "$SYS.REQ.CLAIMS.UPDATE"} {
			if msg, err := sys.Request(subj, []byte(token), 2*time.Second); err == nil {
				t.Logf("%s answered: %.200s", subj, msg.Data)
			}
		}
		seed, _ := evil.Seed()
		evilPath := filepath.Join(t.TempDir(), "evil.nk")
		if err := os.WriteFile(evilPath, seed, 0o600); err != nil {
			t.Fatal(err)
		}
		if nc := rogueUser(t, env.NATSURL(), evilPath, acct, "evil"); nc != nil {
			t.Errorf("after pushing a re-signed account %s, a signing key of the attacker's mints users", acct)
			eraseAll("a signing key the operator key added", nc)
		}
	}

	res := call(t, cs, "audit", map[string]any{"verify": true, "limit": 500})
	out := mustOK(t, res)
	page := structured(t, res)
	chain, _ := page["chain"].(map[string]any)
	if chain["intact"] != true || chain["records"].(float64) < 6 || !strings.Contains(out, "chain: INTACT") {
		t.Fatalf("after the attempts the chain does not verify: %v\n%s", chain, out)
	}
	// The gateway still serves, and still enrols and revokes.
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo still here"}))
}

// rogueUser connects as a new user minted with the seed in path, as
// someone who copied that file would (natsUserFromSeed), or returns nil
// when the server refuses such a user.
func rogueUser(t *testing.T, url, path, issuerAccount, name string) *nats.Conn {
	t.Helper()
	return rogueUserWith(t, url, path, issuerAccount, name, func(*nats.Conn, *nats.Subscription, error) {})
}

// rogueUserWith is rogueUser with the connection's error handler.
func rogueUserWith(t *testing.T, url, path, issuerAccount, name string, errs nats.ErrHandler) *nats.Conn {
	t.Helper()
	seed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	user, _ := nkeys.CreateUser()
	pub, _ := user.PublicKey()
	userSeed, _ := user.Seed()
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	uc.IssuerAccount = issuerAccount
	if issuerAccount != "" {
		uc.UserPermissionLimits = jwt.UserPermissionLimits{}
	}
	token, err := uc.Encode(signer)
	if err != nil {
		return nil
	}
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(token, string(userSeed)), nats.MaxReconnects(0), nats.ErrorHandler(errs))
	if err != nil {
		return nil
	}
	t.Cleanup(nc.Close)
	return nc
}
