package gateway

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// TestRevokeKey: a key no record names, revoked by itself, is refused a
// credential from then on (the fleet account's revocations hold it); a
// host's current key revoked by itself revokes the host and closes its
// connection.
func TestRevokeKey(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	stray, _ := nkeys.CreateUser()
	strayPub, _ := stray.PublicKey()
	if host, err := gw.RevokeKey(ctx, strayPub, "ops"); err != nil || host != "" {
		t.Fatalf("revoking a key no record names: %q, %v", host, err)
	}
	if _, err := gw.EnrolLocal(ctx, "web-9", strayPub, nil); !errors.Is(err, ErrKeyRevoked) {
		t.Errorf("enrolling a key revoked by itself: %v; want ErrKeyRevoked", err)
	}
	if _, err := gw.RevokeKey(ctx, "not-a-key", "ops"); !errors.Is(err, errBadAdminRequest) {
		t.Errorf("revoking something that is no key: %v", err)
	}

	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	creds, err := gw.EnrolLocal(ctx, "web-1", pub, nil)
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	nc, err := nats.Connect(gw.NATSURL(), nats.UserJWTAndSeed(creds.JWT, string(seed)), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if host, err := gw.RevokeKey(ctx, pub, "ops"); err != nil || host != "web-1" {
		t.Fatalf("revoking web-1's key: %q, %v", host, err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Error("web-1's connection stayed open after its key was revoked")
	}
	if rec, err := gw.Agent(ctx, "web-1"); err != nil || !rec.Revoked() || rec.RevokedBy != "ops" {
		t.Errorf("web-1's record after its key was revoked: %+v, %v", rec, err)
	}
}
