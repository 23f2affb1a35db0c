package gateway

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The embedded gateway's own users (made at each start) may not delete,
// update, purge or restore the buckets of the join tokens and agent
// records, nor the audit stream; after the attempts the streams are there
// with their creation time, and the gateway still sweeps its tokens.
func TestProtectedStreamsRefuseRuntimeUsers(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// (The gateway's host connection is the same user.)
	for _, conn := range []struct {
		name string
		nc   *nats.Conn
	}{{"the gateway's connection", gw.nc}} {
		for _, stream := range protectedStreams() {
			before := streamCreated(t, gw.nc, stream)
			for _, op := range []string{"DELETE", "UPDATE", "PURGE", "RESTORE", "MSG.DELETE", "PEER.REMOVE"} {
				subj := "$JS.API.STREAM." + op + "." + stream
				body := []byte(`{}`)
				if op == "UPDATE" || op == "RESTORE" {
					body = []byte(`{"name":"` + stream + `","config":{"name":"` + stream + `"}}`)
				}
				rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
				msg, err := conn.nc.RequestWithContext(rctx, subj, body)
				rcancel()
				if err == nil && !strings.Contains(string(msg.Data), `"error"`) {
					t.Errorf("as %s, %s was carried out: %s", conn.name, subj, msg.Data)
				}
			}
			if after := streamCreated(t, gw.nc, stream); !after.Equal(before) {
				t.Errorf("%s: created %s, was %s", stream, after, before)
			}
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	if _, err := gw.tokens.sweep(sctx, time.Now()); err != nil {
		t.Errorf("token sweep: %v", err)
	}
}

// streamCreated returns when stream was made, as nc reads it.
func streamCreated(t *testing.T, nc *nats.Conn, stream string) time.Time {
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

// kvStreamConfig makes the stream nats.go's KeyValue client makes, but
// for direct gets on a replicated bucket and rollups, which it refuses
// (a rollup purges a bucket with a plain publish); a bucket made by a
// gateway of an older version (create-or-update) gets its rollups turned
// off, and one whose configuration changed is put back through the
// admin, or left and logged without one.
func TestEnsureProtectedBucket(t *testing.T) {
	s := newAuditServer(t)
	nc, err := nats.Connect(s.ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kc := jetstream.KeyValueConfig{Bucket: "older", Description: "d", History: 1, Storage: jetstream.FileStorage, MaxValueSize: 1024}
	if _, err := js.CreateOrUpdateKeyValue(ctx, kc); err != nil {
		t.Fatal(err)
	}
	st, _ := js.Stream(ctx, "KV_older")
	if d := kvConfigDiffers(kvStreamConfig(kc), st.CachedInfo().Config); d != "allow_rollup_hdrs true (want false)" {
		t.Fatalf("nats.go's bucket differs from kvStreamConfig's: %q; want only its rollups", d)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	updates := 0
	admin := func(ctx context.Context, do func(jetstream.JetStream) error) error { updates++; return do(js) }
	if _, err := ensureProtectedBucket(js, 5*time.Second, kc, admin, log); err != nil || updates != 1 {
		t.Fatalf("an older gateway's bucket: %v, %d updates; want its rollups turned off", err, updates)
	}
	st, _ = js.Stream(ctx, "KV_older")
	cfg := st.CachedInfo().Config
	cfg.MaxMsgsPerSubject, cfg.Description = 5, "changed"
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := ensureProtectedBucket(js, 5*time.Second, kc, nil, log); err != nil {
		t.Fatalf("without an admin: %v", err)
	}
	kv, err := ensureProtectedBucket(js, 5*time.Second, kc, admin, log)
	if err != nil || updates != 2 {
		t.Fatalf("with an admin: %v, %d updates", err, updates)
	}
	if info, _ := js.Stream(ctx, "KV_older"); kvConfigDiffers(kvStreamConfig(kc), info.CachedInfo().Config) != "" {
		t.Errorf("not put back: %+v", info.CachedInfo().Config)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	// A new bucket, replicated or not, is made with a plain create.
	fresh := jetstream.KeyValueConfig{Bucket: "fresh", History: 1, Storage: jetstream.FileStorage}
	if _, err := ensureProtectedBucket(js, 5*time.Second, fresh, nil, log); err != nil {
		t.Fatal(err)
	}
	if info, _ := js.Stream(ctx, "KV_fresh"); !info.CachedInfo().Config.AllowDirect || info.CachedInfo().Config.DenyPurge {
		t.Errorf("fresh bucket: %+v", info.CachedInfo().Config)
	}
	if kvStreamConfig(jetstream.KeyValueConfig{Bucket: "r", Replicas: 3}).AllowDirect {
		t.Error("a replicated bucket would be made with direct gets")
	}
}

func TestDeniesSubject(t *testing.T) {
	deny := runtimeDenied()
	for _, tc := range []struct {
		deny []string
		subj string
		want bool
	}{
		{deny, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", true},
		{deny, "$JS.API.STREAM.RESTORE.KV_" + protocol.AgentsBucket, true},
		{deny, "$JS.API.STREAM.UPDATE.KV_fleet_hosts", false},
		{deny, "$JS.hub.API.STREAM.DELETE.KV_fleet_tokens", true},
		{deny, "$JS.hub.API.STREAM.DELETE." + protocol.AuditStream, true},
		{nil, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", false},
		{[]string{"$JS.API.>"}, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", true},
		{[]string{"$JS.API.STREAM.*.KV_fleet_tokens"}, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", true},
		{[]string{"$JS.API.STREAM.*"}, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", false},
		{[]string{"$JS.API.STREAM.UPDATE.KV_fleet_tokens.x"}, "$JS.API.STREAM.UPDATE.KV_fleet_tokens", false},
	} {
		if got := deniesSubject(tc.deny, tc.subj); got != tc.want {
			t.Errorf("deniesSubject(%v, %q) = %v, want %v", tc.deny, tc.subj, got, tc.want)
		}
	}
}
