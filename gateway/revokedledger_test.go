package gateway

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A revoked key stays refused after its entry left the fleet account's
// revocations (every credential issued for it expired, so the reconcile
// pruned it) and an old copy of its host's record, from before the
// revocation, was put back: the ledger holds it, for this gateway and
// for one that reads the ledger afresh. Entries not sealed by a gateway
// are ignored.
func TestRevokedKeyStaysRevokedAfterPruning(t *testing.T) {
	clock := &testClock{t: time.Now()}
	gw := startAPIGateway(t, clock, nil)
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{})
	kp := newUser(t)
	pub := publicKey(kp)
	if _, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, clock.now())); code != "" {
		t.Fatal(code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(gw.nc)
	kv, err := js.KeyValue(ctx, protocol.AgentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := kv.Get(ctx, "web-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.RevokeAgent(ctx, "web-1", "test"); err != nil {
		t.Fatal(err)
	}
	if _, ok := gw.revokedKeys.revokedAt(pub); !ok {
		t.Fatal("the revoked key is not in the ledger")
	}

	clock.advance(gw.cfg.AgentCredentialTTL + 30*24*time.Hour)
	if err := gw.authority.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	ac, _ := gw.authority.src.current(ctx, gw.sys)
	if _, ok := ac.Revocations[pub]; ok {
		t.Fatal("the reconcile did not prune the expired entry: the test does not reach the case")
	}
	if _, err := kv.Put(ctx, "web-1", saved.Value()); err != nil {
		t.Fatal(err)
	}
	// (A running gateway keeps the revocation it read; one that starts
	// now would read the copy. Whatever the record says, no credential.)
	if _, err := gw.authority.AgentJWT("web-1", pub, clock.now().Add(time.Hour)); !errors.Is(err, ErrKeyRevoked) {
		t.Errorf("a credential for the revoked key, with its old record back: %v", err)
	}

	// A junk entry, and an entry sealed by nobody, for another key.
	other := publicKey(newUser(t))
	for _, data := range [][]byte{[]byte("junk"), []byte(`{"record":{"key":"` + other + `"},"seal":"AAAA"}`)} {
		msg := &nats.Msg{Subject: protocol.RevokedKeysSubject(), Data: data, Header: nats.Header{revokedKeyHeader: []string{other}}}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	seal, _ := gw.recordSeal()
	fresh, err := openRevokedLedger(ctx, gw.nc, seal, 1, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.close()
	if _, ok := fresh.revokedAt(pub); !ok {
		t.Error("a gateway reading the ledger afresh does not hold the revoked key")
	}
	if _, ok := fresh.revokedAt(other); ok {
		t.Error("an entry sealed by nobody was taken")
	}
	if _, err := gw.authority.AgentJWT("web-1", other, clock.now().Add(time.Hour)); err != nil {
		t.Errorf("a key named only by unsealed entries is refused: %v", err)
	}
}

// A sealed entry of the ledger naming the gateway's own user (written by
// whoever holds the seal's key) does not cut the gateway off its
// server: every node applies the ledger's new keys but its own users'.
func TestLedgerSparesTheGatewaysOwnUsers(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	gw.embedded.mu.Lock()
	var own []string
	for k := range gw.embedded.own {
		own = append(own, k)
	}
	gw.embedded.mu.Unlock()
	if len(own) != 2 {
		t.Fatalf("the gateway's own users: %v", own)
	}
	seal, _ := gw.recordSeal()
	other, err := openRevokedLedger(ctx, gw.nc, seal, 1, slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.close()
	var keys []revokedKey
	for _, k := range own {
		keys = append(keys, revokedKey{pub: k, revokedAt: time.Now()})
	}
	if err := other.record(ctx, keys); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the gateway's ledger to read the entries", func() bool {
		_, ok := gw.revokedKeys.revokedAt(own[0])
		return ok
	})
	time.Sleep(200 * time.Millisecond) // a revocation would have closed the connections by now
	if !gw.nc.IsConnected() || !gw.sys.IsConnected() {
		t.Fatal("the gateway's own users were cut off")
	}
	ac, _ := gw.authority.src.current(ctx, gw.sys)
	for _, k := range own {
		if _, ok := ac.Revocations[k]; ok {
			t.Errorf("the server holds the gateway's own user %s revoked", k)
		}
	}
	if _, err := gw.nc.Request(protocol.RevokedKeysSubject()+".x", nil, time.Second); errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatal(err)
	}
}
