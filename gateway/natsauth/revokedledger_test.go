package natsauth

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The ledger holds every key revoked, for a gateway that reads it
// afresh too; entries not sealed by a gateway are ignored.
func TestLedgerReadAfresh(t *testing.T) {
	_, a, nc, _ := startTestEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := a.OpenLedger(ctx, nc, 1, time.Now().Add(-time.Hour), log); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	kp, _ := nkeys.CreateUser()
	pub := publicKey(kp)
	if err := a.RevokeKeys(ctx, time.Now(), pub); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.LedgerRevokedAt(pub); !ok {
		t.Fatal("the revoked key is not in the ledger")
	}
	// A junk entry, and an entry sealed by nobody, for another key.
	js, _ := jetstream.New(nc)
	otherKP, _ := nkeys.CreateUser()
	other := publicKey(otherKP)
	for _, data := range [][]byte{[]byte("junk"), []byte(`{"record":{"key":"` + other + `"},"seal":"AAAA"}`)} {
		msg := &nats.Msg{Subject: protocol.RevokedKeysSubject(), Data: data, Header: nats.Header{revokedKeyHeader: []string{other}}}
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	seal, _ := newLedgerSeal(a.agentSigner)
	fresh, err := openRevokedLedger(ctx, nc, seal, 1, log, nil)
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
	if _, err := a.AgentJWT("web-1", pub, time.Now().Add(time.Hour)); !errors.Is(err, ErrKeyRevoked) {
		t.Errorf("a credential for the revoked key: %v", err)
	}
	if _, err := a.AgentJWT("web-1", other, time.Now().Add(time.Hour)); err != nil {
		t.Errorf("a key named only by unsealed entries is refused: %v", err)
	}
}

// A sealed entry of the ledger naming the gateway's own user (written by
// whoever holds the seal's key) does not cut the gateway off its
// server: every node applies the ledger's new keys but its own users'.
func TestLedgerSparesTheGatewaysOwnUsers(t *testing.T) {
	emb, a, nc, _ := startTestEmbedded(t)
	sys := a.sys
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := a.OpenLedger(ctx, nc, 1, time.Now().Add(-time.Hour), log); err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	emb.acct.mu.Lock()
	var own []string
	for k := range emb.acct.own {
		own = append(own, k)
	}
	emb.acct.mu.Unlock()
	if len(own) != 2 {
		t.Fatalf("the gateway's own users: %v", own)
	}
	seal, _ := newLedgerSeal(a.agentSigner)
	other, err := openRevokedLedger(ctx, nc, seal, 1, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.close()
	var keys []RevokedKey
	for _, k := range own {
		keys = append(keys, RevokedKey{Pub: k, RevokedAt: time.Now()})
	}
	if err := other.record(ctx, keys); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the gateway's ledger to read the entries", func() bool {
		_, ok := a.LedgerRevokedAt(own[0])
		return ok
	})
	time.Sleep(200 * time.Millisecond) // a revocation would have closed the connections by now
	if !nc.IsConnected() || !sys.IsConnected() {
		t.Fatal("the gateway's own users were cut off")
	}
	ac, _ := a.src.current(ctx, sys)
	for _, k := range own {
		if _, ok := ac.Revocations[k]; ok {
			t.Errorf("the server holds the gateway's own user %s revoked", k)
		}
	}
	if _, err := nc.Request(protocol.RevokedKeysSubject()+".x", nil, time.Second); errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatal(err)
	}
}

// A revocation another node pushes (or the ledger brings) while the
// authority works on its own copy of the account (between reading it and
// applying it: a ledger write, a reconcile) is kept: the server and the
// saved account JWT hold both.
func TestRevocationAddedMeanwhileKept(t *testing.T) {
	emb, a, _, _ := startTestEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	user := func() string {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		return pub
	}
	mine, theirs, now := user(), user(), time.Now().Unix()
	ac, err := emb.acct.current(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := emb.acct.addRevocations(map[string]int64{theirs: now}); err != nil || n != 1 {
		t.Fatalf("the revocation meanwhile: %d, %v", n, err)
	}
	if ac.Revocations == nil {
		ac.Revocations = map[string]int64{}
	}
	ac.Revocations[mine] = now
	if err := emb.acct.apply(ac); err != nil {
		t.Fatal(err)
	}
	held, err := a.HeldRevocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	saved, err := emb.acct.saved()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{mine, theirs} {
		if held[k] != now {
			t.Errorf("the server does not hold %s revoked: %v", k, held)
		}
		if saved[k] != now {
			t.Errorf("the saved account JWT does not hold %s revoked: %v", k, saved)
		}
	}
}
