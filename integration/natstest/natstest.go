// Package natstest runs the embedded NATS servers tests talk to: on a
// random loopback port unless the options say otherwise, without signal
// handlers or logs, ready before it returns, shut down (and waited for)
// when the test ends. The gateway's, the agent's and the end-to-end
// tests share it.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyWithin bounds the wait for a server to take connections.
const readyWithin = 10 * time.Second

// Start runs a server with opts (nil: the defaults) until t ends. Host
// and Port default to 127.0.0.1 and a random port; the server never
// installs signal handlers nor logs.
func Start(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	if opts == nil {
		opts = &server.Options{}
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Port == 0 {
		opts.Port = -1
	}
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("NATS server: %v", err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(readyWithin) {
		t.Fatalf("NATS server not ready within %s", readyWithin)
	}
	return ns
}

// StartJetStream runs a server with JetStream, its store in a directory
// of t's, until t ends.
func StartJetStream(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	if opts == nil {
		opts = &server.Options{}
	}
	opts.JetStream = true
	if opts.StoreDir == "" {
		opts.StoreDir = t.TempDir()
	}
	return Start(t, opts)
}
