package jskv

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/integration/natstest"
)

// StreamConfig makes the stream nats.go's KeyValue client makes, but
// for direct gets on a replicated bucket and rollups, which it refuses
// (a rollup purges a bucket with a plain publish); a bucket made by a
// gateway of an older version (create-or-update) gets its rollups turned
// off, and one whose configuration changed is put back through the
// admin, or left and logged without one.
func TestEnsureProtectedBucket(t *testing.T) {
	s := natstest.StartJetStream(t, nil)
	nc, err := nats.Connect(s.ClientURL())
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
	if d := ConfigDiffers(StreamConfig(kc), st.CachedInfo().Config); d != "allow_rollup_hdrs true (want false)" {
		t.Fatalf("nats.go's bucket differs from StreamConfig's: %q; want only its rollups", d)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	updates := 0
	admin := func(ctx context.Context, do func(jetstream.JetStream) error) error { updates++; return do(js) }
	if _, err := EnsureProtectedBucket(js, 5*time.Second, kc, admin, log); err != nil || updates != 1 {
		t.Fatalf("an older gateway's bucket: %v, %d updates; want its rollups turned off", err, updates)
	}
	st, _ = js.Stream(ctx, "KV_older")
	cfg := st.CachedInfo().Config
	cfg.MaxMsgsPerSubject, cfg.Description = 5, "changed"
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := EnsureProtectedBucket(js, 5*time.Second, kc, nil, log); err != nil {
		t.Fatalf("without an admin: %v", err)
	}
	kv, err := EnsureProtectedBucket(js, 5*time.Second, kc, admin, log)
	if err != nil || updates != 2 {
		t.Fatalf("with an admin: %v, %d updates", err, updates)
	}
	if info, _ := js.Stream(ctx, "KV_older"); ConfigDiffers(StreamConfig(kc), info.CachedInfo().Config) != "" {
		t.Errorf("not put back: %+v", info.CachedInfo().Config)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	// A new bucket, replicated or not, is made with a plain create.
	fresh := jetstream.KeyValueConfig{Bucket: "fresh", History: 1, Storage: jetstream.FileStorage}
	if _, err := EnsureProtectedBucket(js, 5*time.Second, fresh, nil, log); err != nil {
		t.Fatal(err)
	}
	if info, _ := js.Stream(ctx, "KV_fresh"); !info.CachedInfo().Config.AllowDirect || info.CachedInfo().Config.DenyPurge {
		t.Errorf("fresh bucket: %+v", info.CachedInfo().Config)
	}
	if StreamConfig(jetstream.KeyValueConfig{Bucket: "r", Replicas: 3}).AllowDirect {
		t.Error("a replicated bucket would be made with direct gets")
	}
}
