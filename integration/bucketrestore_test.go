package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// streamSnapshot is a JetStream stream's snapshot as the API gives it:
// its configuration and state, and the archive's bytes.
type streamSnapshot struct {
	Config json.RawMessage `json:"config"`
	State  json.RawMessage `json:"state"`
	data   []byte
}

// snapshotStream takes a snapshot of stream as nc, as `nats stream
// backup` does: the server sends the archive in chunks to an inbox, each
// acknowledged, and ends with an empty message whose status says how it
// went.
func snapshotStream(t *testing.T, nc *nats.Conn, stream string) *streamSnapshot {
	t.Helper()
	inbox := nats.NewInbox()
	chunks, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer chunks.Unsubscribe()
	req, _ := json.Marshal(map[string]any{"deliver_subject": inbox, "chunk_size": 64 << 10})
	msg, err := nc.Request("$JS.API.STREAM.SNAPSHOT."+stream, req, 5*time.Second)
	if err != nil {
		t.Fatalf("snapshot %s: %v", stream, err)
	}
	snap := &streamSnapshot{}
	if err := json.Unmarshal(msg.Data, snap); err != nil || len(snap.Config) == 0 {
		t.Fatalf("snapshot %s: %s (%v)", stream, msg.Data, err)
	}
	for {
		m, err := chunks.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("snapshot %s: %v", stream, err)
		}
		if len(m.Data) == 0 {
			if s := m.Header.Get("Status"); s != "" && s != "204" {
				t.Fatalf("snapshot %s ended with status %s %s", stream, s, m.Header.Get("Description"))
			}
			return snap
		}
		snap.data = append(snap.data, m.Data...)
		if m.Reply != "" {
			_ = m.Respond(nil)
		}
	}
}

// restoreStream restores snap as stream, as `nats stream restore` does;
// an error when the server refuses it or does not answer (a request the
// user may not publish goes nowhere).
func restoreStream(nc *nats.Conn, stream string, snap *streamSnapshot) error {
	req, _ := json.Marshal(map[string]json.RawMessage{"config": snap.Config, "state": snap.State})
	msg, err := nc.Request("$JS.API.STREAM.RESTORE."+stream, req, 2*time.Second)
	if err != nil {
		return fmt.Errorf("restore request: %w", err)
	}
	var resp struct {
		Deliver string          `json:"deliver_subject"`
		Error   json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil || resp.Error != nil || resp.Deliver == "" {
		return fmt.Errorf("restore refused: %s", msg.Data)
	}
	for data := snap.data; len(data) > 0; {
		n := min(len(data), 64<<10)
		if _, err := nc.Request(resp.Deliver, data[:n], 5*time.Second); err != nil {
			return fmt.Errorf("restore chunk: %w", err)
		}
		data = data[n:]
	}
	end, err := nc.Request(resp.Deliver, nil, 30*time.Second)
	if err != nil {
		return fmt.Errorf("restore end: %w", err)
	}
	var done struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(end.Data, &done) != nil || done.Error != nil {
		return fmt.Errorf("restore failed: %s", end.Data)
	}
	return nil
}

// rollbackAttempts are the requests, besides a restore, with which a
// user would roll a bucket back or erase it: delete it (to restore an
// old snapshot in its place), cut it to one message per key or turn its
// deny flags off, purge it, delete single records.
func rollbackAttempts(t *testing.T, stream string, cfg []byte) map[string][]byte {
	t.Helper()
	var sc map[string]any
	if err := json.Unmarshal(cfg, &sc); err != nil {
		t.Fatal(err)
	}
	sc["max_msgs"], sc["deny_delete"], sc["max_age"] = 1, false, int64(time.Second)
	update, _ := json.Marshal(sc)
	return map[string][]byte{
		"$JS.API.STREAM.UPDATE." + stream:     update,
		"$JS.API.STREAM.DELETE." + stream:     nil,
		"$JS.API.STREAM.PURGE." + stream:      []byte(`{}`),
		"$JS.API.STREAM.MSG.DELETE." + stream: []byte(`{"seq":1,"no_erase":true}`),
	}
}

// TestBucketRollbackRefusedToRuntimeCreds: with the gateway's own creds
// (gateway.creds, as nats-setup writes it), someone snapshots the join
// tokens' and agent records' buckets while a one-use token is unused and
// a host not yet revoked, lets the token be spent and the host be
// revoked, then tries to put the buckets back: delete and restore the
// snapshots, update, purge. Each is refused, the streams keep their
// creation time, the token stays spent and the host revoked. With the
// account key (kept offline by an external setup) the same steps go
// through, and the token enrols again: the limit gateway/README.md
// states.
func TestBucketRollbackRefusedToRuntimeCreds(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{}, Gateway: func(c *gateway.Config) {
		c.APIListen, c.DataDir = "127.0.0.1:0", t.TempDir()
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gw, err := nats.Connect(env.NATSURL(), nats.UserCredentials(filepath.Join(env.setup, gateway.NATSSetupFiles.GatewayCreds)),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()

	victimCreds, victimSeed := env.Enrol("victim")
	tok, err := env.Gateway.CreateJoinToken(ctx, &protocol.TokenCreateRequest{}, "ops")
	if err != nil {
		t.Fatal(err)
	}
	tokens, agents := "KV_fleet_tokens", "KV_"+protocol.AgentsBucket
	snaps := map[string]*streamSnapshot{tokens: snapshotStream(t, gw, tokens), agents: snapshotStream(t, gw, agents)}
	created := map[string]time.Time{tokens: streamCreatedAt(t, gw, tokens), agents: streamCreatedAt(t, gw, agents)}

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
	if err := env.Gateway.RevokeAgent(ctx, "victim", "ops"); err != nil {
		t.Fatal(err)
	}

	for _, stream := range []string{tokens, agents} {
		tryErase(t, gateway.NATSSetupFiles.GatewayCreds, gw, rollbackAttempts(t, stream, snaps[stream].Config))
		if err := restoreStream(gw, stream, snaps[stream]); err == nil {
			t.Errorf("as the gateway's user, %s was restored from its snapshot", stream)
		}
		if got := streamCreatedAt(t, gw, stream); !got.Equal(created[stream]) {
			t.Errorf("%s was made again (created %s, was %s)", stream, got, created[stream])
		}
	}
	var aerr *protocol.APIError
	if err := enrol("web-2"); !errors.As(err, &aerr) || aerr.Code != protocol.APITokenSpent {
		t.Errorf("the spent token after the rollback attempts: %v; want token_spent", err)
	}
	if rec, err := env.Gateway.Agent(ctx, "victim"); err != nil || !rec.Revoked() {
		t.Errorf("victim's record after the rollback attempts: %+v, %v; want it revoked", rec, err)
	}
	if nc, err := nats.Connect(env.NATSURL(), nats.UserJWTAndSeed(victimCreds.JWT, string(victimSeed))); err == nil {
		nc.Close()
		t.Error("the revoked host's credential connects again")
	}

	// The account key is no runtime credential: with it, the same steps
	// go through. What becomes of the token then is the server's doing,
	// not a guarantee: nats-server 2.15.2 gives the restored stream a new
	// creation time (so the record reads as put back), though its restore
	// takes the sequences, and a creation time from the archive's
	// metadata, from whoever made the archive. Logged, not checked.
	rogue := roguePublisher(t, env)
	if _, err := rogue.Request("$JS.API.STREAM.DELETE."+tokens, nil, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := restoreStream(rogue, tokens, snaps[tokens]); err != nil {
		t.Fatalf("with the account key: %v", err)
	}
	t.Logf("with the account key, %s was deleted and restored: created %s, was %s; the spent token then: %v",
		tokens, streamCreatedAt(t, rogue, tokens), created[tokens], enrol("web-3"))
}

// streamCreatedAt returns when stream was made, as nc reads it.
func streamCreatedAt(t *testing.T, nc *nats.Conn, stream string) time.Time {
	t.Helper()
	msg, err := nc.Request("$JS.API.STREAM.INFO."+stream, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("info %s: %v", stream, err)
	}
	var si struct {
		Created time.Time `json:"created"`
	}
	if err := json.Unmarshal(msg.Data, &si); err != nil || si.Created.IsZero() {
		t.Fatalf("info %s: %s (%v)", stream, msg.Data, err)
	}
	return si.Created
}
