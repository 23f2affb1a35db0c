package jskv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/integration/natstest"
)

// TestJSUnanswered: the errors that mean JetStream did not answer (a
// leader election, an account's claims being applied) are retried, in
// both of nats.go's APIs and wrapped; those that mean it answered no are
// not.
func TestJSUnanswered(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{nats.ErrTimeout, true},
		{nats.ErrNoResponders, true},
		{jetstream.ErrNoStreamResponse, true},
		{jetstream.ErrJetStreamNotEnabled, true},
		{jetstream.ErrJetStreamNotEnabledForAccount, true},
		{nats.ErrJetStreamNotEnabled, true},
		{nats.ErrJetStreamNotEnabledForAccount, true},
		{fmt.Errorf("list join tokens: %w", nats.ErrJetStreamNotEnabled), true},
		{&jetstream.APIError{Code: 503, Description: "unavailable"}, true},
		{&nats.APIError{Code: 503, Description: "unavailable"}, true},
		{jetstream.ErrKeyNotFound, false},
		{jetstream.ErrKeyExists, false},
		{nats.ErrKeyNotFound, false},
		{&nats.APIError{Code: 400, Description: "bad request"}, false},
		{errors.New("something else"), false},
	} {
		if got := Unanswered(tc.err); got != tc.want {
			t.Errorf("Unanswered(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestRetryJSWhileJetStreamAway: a KV watch made while no server
// answers for JetStream (as while one applies an account's new claims)
// fails with the older nats API's "jetstream not enabled", which a KV
// watch reports; Retry tries it again, and the watch made once
// JetStream is back reads the bucket.
func TestRetryJSWhileJetStreamAway(t *testing.T) {
	store := t.TempDir()
	ns := natstest.StartJetStream(t, &server.Options{StoreDir: store})
	port := ns.Addr().(*net.TCPAddr).Port
	nc, err := nats.Connect(ns.ClientURL(), nats.Name("watcher"), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "away"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	// restart replaces the server on the same port, with JetStream or
	// without, and waits for the connection to come back to it.
	restart := func(withJS bool) {
		ns.Shutdown()
		ns.WaitForShutdown()
		if withJS {
			ns = natstest.StartJetStream(t, &server.Options{Port: port, StoreDir: store})
		} else {
			ns = natstest.Start(t, &server.Options{Port: port})
		}
		for deadline := time.Now().Add(10 * time.Second); nc.ConnectedServerId() != ns.ID(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the connection did not come back within 10 s")
			}
		}
	}
	restart(false)
	attempts := 0
	var first error
	w, err := Retry(ctx, func(context.Context) (jetstream.KeyWatcher, error) {
		attempts++
		w, err := kv.WatchAll(ctx)
		if attempts == 1 {
			first = err
			restart(true)
		}
		return w, err
	})
	if !errors.Is(first, nats.ErrJetStreamNotEnabled) {
		t.Fatalf("a watch made with no JetStream there failed with %v, want nats.ErrJetStreamNotEnabled", first)
	}
	if err != nil {
		t.Fatalf("Retry gave up after %d attempts: %v (the first failed with %v)", attempts, err, first)
	}
	defer w.Stop()
	select {
	case e := <-w.Updates():
		if e == nil || e.Key() != "k" || string(e.Value()) != "v" {
			t.Fatalf("the watch read %v, want k=v", e)
		}
	case <-ctx.Done():
		t.Fatal("the watch read nothing")
	}
}
