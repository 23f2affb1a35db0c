package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// These tests are what someone who holds the fleet NATS account's key
// (the seed in the gateway's data directory) can try against revocation
// and join tokens: every user minted with it may write the gateways'
// JetStream buckets. Revocation must go through whatever the record says,
// and a spent token must stay spent.

// rogueWithAccountKey connects to url as a new user minted with the
// account key in the file seedPath.
func rogueWithAccountKey(t *testing.T, url, seedPath string) *nats.Conn {
	t.Helper()
	return natsUserFromSeed(t, url, seedPath, "", "rogue")
}

// rogueKV opens bucket as nc's user.
func rogueKV(t *testing.T, nc *nats.Conn, bucket string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// embeddedRogue connects to env's embedded server as a user minted with
// the gateway signing key of its gateway's data directory: it may write
// the gateways' buckets, as the gateway's own users may.
func embeddedRogue(t *testing.T, env *Env) *nats.Conn {
	t.Helper()
	dir := filepath.Join(env.gwConfig.DataDir, "nats")
	account, err := os.ReadFile(filepath.Join(dir, "account.pub"))
	if err != nil {
		t.Fatal(err)
	}
	return natsUserFromSeed(t, env.NATSURL(), filepath.Join(dir, "gateway-signer.nk"), strings.TrimSpace(string(account)), "rogue")
}

// fleetctlAt runs the fleetctl binary against gw's fleet API (with
// authentication off, the admin API answers callers on this machine).
func fleetctlAt(t *testing.T, gw *gateway.Gateway, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, fleetctlBinary(t), append([]string{"--gateway", "https://" + gw.APIAddr(), "--ca_pin", gw.APICAPin()}, args...)...)
	cmd.Env = append(os.Environ(), "FLEET_API_TOKEN=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// revokedWithin checks that live, a connection with a host's credential,
// was cut off within a second of start, and that the credential is
// refused from then on.
func revokedWithin(t *testing.T, env *Env, live *watchedConn, start time.Time, creds gateway.AgentCredentials, seed []byte) {
	t.Helper()
	took := live.WaitCut(t, 10*time.Second).Sub(start)
	t.Logf("the live connection was closed %s after the revoke began", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the connection was closed %s after the revoke began; want within 1s", took)
	}
	live.WaitErr(t, "the server to say the credential was revoked", func(err error) bool { return errors.Is(err, nats.ErrAuthRevoked) })
	if nc, err := nats.Connect(env.NATSURL(), nats.UserJWTAndSeed(creds.JWT, string(seed))); err == nil {
		nc.Close()
		t.Error("a new connection with the revoked credential was admitted")
	}
}

// namesRevoked reports whether rec names pub revoked.
func namesRevoked(rec *gateway.AgentRecord, pub string) bool {
	if rec.PublicKey == pub {
		return rec.Revoked()
	}
	for _, k := range rec.RevokedKeys {
		if k.PublicKey == pub {
			return true
		}
	}
	return false
}

// TestRevokeWhateverTheRecordSays: a user minted with the account key
// from the gateway's data directory forges a host's record (a sealed
// record with another key in it), damages it, or deletes it; fleetctl
// agent revoke still revokes the host (by name, or by key), its live
// connection is closed within a second and its credential refused, and
// its record is written again, sealed and revoked.
func TestRevokeWhateverTheRecordSays(t *testing.T) {
	fleetctlBinary(t) // built before any revoke is timed
	env := NewEnv(t, Options{Agents: []string{}, Gateway: func(c *gateway.Config) { c.APIListen = "127.0.0.1:0" }})
	kv := rogueKV(t, embeddedRogue(t, env), protocol.AgentsBucket)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	other, _ := nkeys.CreateUser()
	otherPub, _ := other.PublicKey()
	tamper := map[string]func(host string){
		// The record's seal copied over a record that names another key.
		"forged": func(host string) {
			e, err := kv.Get(ctx, host)
			if err != nil {
				t.Fatal(err)
			}
			var s struct {
				Record map[string]any `json:"record"`
				Seal   string         `json:"seal"`
			}
			if err := json.Unmarshal(e.Value(), &s); err != nil {
				t.Fatal(err)
			}
			s.Record["public_key"] = otherPub
			data, _ := json.Marshal(s)
			if _, err := kv.Put(ctx, host, data); err != nil {
				t.Fatal(err)
			}
		},
		"damaged": func(host string) {
			if _, err := kv.Put(ctx, host, []byte("{not a record")); err != nil {
				t.Fatal(err)
			}
		},
		"deleted": func(host string) {
			if err := kv.Delete(ctx, host); err != nil {
				t.Fatal(err)
			}
		},
	}
	for _, tc := range []struct{ name, how string }{{"forged", "name"}, {"damaged", "name"}, {"deleted", "name"}, {"deleted", "key"}} {
		t.Run(tc.name+"-by-"+tc.how, func(t *testing.T) {
			host := "victim-" + tc.name + "-" + tc.how
			creds, seed := env.Enrol(host)
			live := watchConn(t, env.NATSURL(), creds.JWT, seed, creds.CAPEM)
			tamper[tc.name](host)
			if _, err := env.Gateway.Agent(ctx, host); err == nil {
				t.Fatalf("the %s record still reads as good", tc.name)
			}
			args := []string{"agent", "revoke", host}
			if tc.how == "key" {
				args = []string{"agent", "revoke", "--key", publicOf(t, seed)}
			}
			start := time.Now()
			out, err := fleetctlAt(t, env.Gateway, args...)
			if err != nil {
				t.Fatalf("fleetctl %s over a %s record: %v\n%s", strings.Join(args, " "), tc.name, err, out)
			}
			if !strings.Contains(out, "revoked") || tc.how == "key" && !strings.Contains(out, "of host "+host) {
				t.Errorf("fleetctl says:\n%s", out)
			}
			revokedWithin(t, env, live, start, creds, seed)
			rec, err := env.Gateway.Agent(ctx, host)
			if err != nil || !rec.Revoked() || !namesRevoked(&rec, publicOf(t, seed)) {
				t.Errorf("the record after the revoke: %+v, %v; want it sealed and revoked, naming the key", rec, err)
			}
			// Never issued again for the key, whatever comes next.
			if _, err := env.Gateway.EnrolLocal(ctx, host+"-again", publicOf(t, seed), nil); !errors.Is(err, gateway.ErrKeyRevoked) {
				t.Errorf("enrolling the revoked key under another name: %v; want ErrKeyRevoked", err)
			}
		})
	}
	// A host named as the gateway's own NATS user: only credentials the
	// agent signing key issued are a host's, so the gateway's connections
	// stay.
	creds, seed := env.Enrol("fleet-gateway")
	live := watchConn(t, env.NATSURL(), creds.JWT, seed, creds.CAPEM)
	tamper["deleted"]("fleet-gateway")
	start := time.Now()
	if out, err := fleetctlAt(t, env.Gateway, "agent", "revoke", "fleet-gateway"); err != nil {
		t.Fatalf("fleetctl agent revoke fleet-gateway: %v\n%s", err, out)
	}
	revokedWithin(t, env, live, start, creds, seed)
	if out, err := fleetctlAt(t, env.Gateway, "agent", "list"); err != nil || !strings.Contains(out, "fleet-gateway") {
		t.Errorf("the gateway after revoking a host named as its own NATS user: %v\n%s", err, out)
	}
}

// TestRevokeOverRolledBackRecord: the rogue keeps a sealed copy of a
// host's record, the host is then enrolled again with a new key (the old
// one revoked), and the rogue puts the old copy back while the gateway is
// down, so that the gateway starts with it. Revoking the host by name
// still closes the connection of its current key within a second: the
// NATS servers' list of live connections says which credentials were
// issued for the name.
func TestRevokeOverRolledBackRecord(t *testing.T) {
	fleetctlBinary(t)
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{}, Gateway: func(c *gateway.Config) {
		c.APIListen, c.DataDir = "127.0.0.1:0", t.TempDir()
	}})
	kv := rogueKV(t, roguePublisher(t, env), protocol.AgentsBucket)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := enrolKey(t, env.Gateway, "victim"); err != nil {
		t.Fatal(err)
	}
	old, err := kv.Get(ctx, "victim")
	if err != nil {
		t.Fatal(err)
	}
	creds, seed, err := enrolKey(t, env.Gateway, "victim", gateway.ReplaceHost())
	if err != nil {
		t.Fatal(err)
	}
	live := watchConn(t, env.NATSURL(), creds.JWT, seed, creds.CAPEM)
	if _, err := kv.Put(ctx, "victim", old.Value()); err != nil {
		t.Fatal(err)
	}
	env.RestartGateway()
	if rec, err := env.Gateway.Agent(ctx, "victim"); err != nil || rec.PublicKey == publicOf(t, seed) {
		t.Fatalf("the restarted gateway does not read the old copy: %+v, %v", rec, err)
	}
	start := time.Now()
	if out, err := fleetctlAt(t, env.Gateway, "agent", "revoke", "victim"); err != nil {
		t.Fatalf("fleetctl agent revoke victim over an old copy: %v\n%s", err, out)
	}
	revokedWithin(t, env, live, start, creds, seed)
	rec, err := env.Gateway.Agent(ctx, "victim")
	if err != nil || !rec.Revoked() || !namesRevoked(&rec, publicOf(t, seed)) {
		t.Errorf("the record after the revoke: %+v, %v; want it revoked, naming the live key", rec, err)
	}
}

// TestSpentTokenStaysSpent: the rogue, with the gateway's own creds,
// saves a one-use join token's sealed record before its use and puts it
// back after (again after deleting it too); the token never enrols a
// host again, and fleetctl lists it as tampered. The gateway's creds may
// not delete the bucket's stream; with the account key (kept offline)
// deleting it does not help either: while it is gone, enrolments are
// refused; made again and filled up so that the copy lands at the
// revision it names, the copy is still refused.
func TestSpentTokenStaysSpent(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{}, Gateway: func(c *gateway.Config) {
		c.APIListen, c.DataDir = "127.0.0.1:0", t.TempDir()
	}})
	rogue, err := nats.Connect(env.NATSURL(), nats.UserCredentials(filepath.Join(env.setup, gateway.NATSSetupFiles.GatewayCreds)))
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	kv := rogueKV(t, rogue, "fleet_tokens")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tok, err := env.Gateway.CreateJoinToken(ctx, &protocol.TokenCreateRequest{}, "ops")
	if err != nil {
		t.Fatal(err)
	}
	saved, err := kv.Get(ctx, tok.Info.ID)
	if err != nil {
		t.Fatal(err)
	}
	client := enrolclient.New("https://"+env.Gateway.APIAddr(), tok.CAPin, 4)
	defer client.Close()
	enrol := func(host string) error {
		kp, _ := nkeys.CreateUser()
		_, err := client.Enrol(ctx, kp, tok.Token, host)
		return err
	}
	if err := enrol("web-1"); err != nil {
		t.Fatalf("the token's one use: %v", err)
	}
	var aerr *protocol.APIError
	if err := enrol("web-2"); !errors.As(err, &aerr) || aerr.Code != protocol.APITokenSpent {
		t.Fatalf("a second use: %v; want token_spent", err)
	}
	for i, putBack := range []func() error{
		func() error { _, err := kv.Put(ctx, tok.Info.ID, saved.Value()); return err },
		func() error {
			if err := kv.Delete(ctx, tok.Info.ID); err != nil {
				return err
			}
			_, err := kv.Put(ctx, tok.Info.ID, saved.Value())
			return err
		},
	} {
		if err := putBack(); err != nil {
			t.Fatal(err)
		}
		host := []string{"web-3", "web-4"}[i]
		err := enrol(host)
		if err == nil {
			t.Fatalf("the spent token enrolled %s after its old record was put back", host)
		}
		if !errors.As(err, &aerr) || aerr.Code != protocol.APITokenRevoked || !strings.Contains(aerr.Message, "put back") {
			t.Errorf("the spent token after its old record was put back: %v; want token_revoked saying it was put back", err)
		}
		if _, err := env.Gateway.Agent(ctx, host); err == nil {
			t.Errorf("%s has a record", host)
		}
	}
	if _, err := rogue.Request("$JS.API.STREAM.DELETE.KV_fleet_tokens", nil, 2*time.Second); err == nil {
		t.Fatal("the gateway's creds deleted the tokens' stream")
	}
	admin := rogueWithAccountKey(t, env.NATSURL(), filepath.Join(env.setup, gateway.NATSSetupFiles.AccountKey))
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, "KV_fleet_tokens"); err != nil {
		t.Fatal(err)
	}
	if err := enrol("web-5"); !errors.As(err, &aerr) || aerr.Code != protocol.APIUnavailable || !strings.Contains(aerr.Message, "deleted") {
		t.Errorf("an enrolment while the tokens' stream is deleted: %v; want unavailable, saying the stream may be deleted", err)
	}
	kv2, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "fleet_tokens", History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i < saved.Revision(); i++ {
		if _, err := kv2.Put(ctx, fmt.Sprintf("filler%d", i), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if rev, err := kv2.Put(ctx, tok.Info.ID, saved.Value()); err != nil || rev != saved.Revision() {
		t.Fatalf("the copy put back at revision %d (%v); want %d, the one it names", rev, err, saved.Revision())
	}
	if err := enrol("web-6"); !errors.As(err, &aerr) || aerr.Code != protocol.APITokenRevoked {
		t.Errorf("the spent token in a stream made again: %v; want token_revoked", err)
	}
	if _, err := env.Gateway.Agent(ctx, "web-6"); err == nil {
		t.Error("web-6 has a record")
	}
	out, err := fleetctlAt(t, env.Gateway, "token", "list")
	if err != nil || !strings.Contains(out, tok.Info.ID) || !strings.Contains(out, protocol.TokenTampered) {
		t.Errorf("fleetctl token list: %v\n%s", err, out)
	}
}
