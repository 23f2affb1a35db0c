package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// A revoked key stays refused after its entry left the fleet account's
// revocations (every credential issued for it expired, so the reconcile
// pruned it) and an old copy of its host's record, from before the
// revocation, was put back: the ledger holds it.
func TestRevokedKeyStaysRevokedAfterPruning(t *testing.T) {
	clock := &testClock{t: time.Now()}
	gw := startAPIGateway(t, clock, nil)
	c := newAPIClient(t, gw)
	tok := c.createToken(protocol.TokenCreateRequest{})
	kp := newUser(t)
	pub, _ := kp.PublicKey()
	if _, code := c.enrol(enrolReq(t, kp, tok.Token, "web-1", c.pin, clock.now())); code != "" {
		t.Fatal(code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, _ := jetstream.New(gw.conns.nc)
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
	if _, ok := gw.subsys.authority.LedgerRevokedAt(pub); !ok {
		t.Fatal("the revoked key is not in the ledger")
	}

	clock.advance(gw.cfg.AgentCredentialTTL + 30*24*time.Hour)
	if err := gw.subsys.authority.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	held, _ := gw.subsys.authority.HeldRevocations(ctx)
	if _, ok := held[pub]; ok {
		t.Fatal("the reconcile did not prune the expired entry: the test does not reach the case")
	}
	if _, err := kv.Put(ctx, "web-1", saved.Value()); err != nil {
		t.Fatal(err)
	}
	// (A running gateway keeps the revocation it read; one that starts
	// now would read the copy. Whatever the record says, no credential,
	// and enrolment sees the refusal as ErrKeyRevoked.)
	if _, err := (enrolIssuer{a: gw.subsys.authority}).AgentJWT("web-1", pub, clock.now().Add(time.Hour)); !errors.Is(err, ErrKeyRevoked) {
		t.Errorf("a credential for the revoked key, with its old record back: %v", err)
	}
}
