//go:build unix

package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// An agent whose credential is another host's (the server refuses it the
// host's subjects) stops at start and says why; it never announces.
func TestRunStopsWhenNATSRefusesTheHost(t *testing.T) {
	perms := func(host string) *server.Permissions {
		return &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{protocol.PresenceSubject(host)}},
			Subscribe: &server.SubjectPermission{Allow: []string{
				protocol.HostSubjects(host), protocol.DiscoverSubject(), protocol.AgentInboxPrefix(host) + ".>",
			}},
		}
	}
	ns := startTestNATSWith(t, func(o *server.Options) {
		o.Users = []*server.User{
			{Username: "web-1", Password: "p1", Permissions: perms("web-1")},
			// A user whose permissions on the server are not its host's.
			{Username: "web-3", Password: "p1", Permissions: perms("web-1")},
			{Username: "watcher", Password: "w"},
		}
	})
	watcher, err := nats.Connect(ns.ClientURL(), nats.UserInfo("watcher", "w"))
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	announces, err := watcher.SubscribeSync(protocol.PresenceWildcard())
	if err != nil {
		t.Fatal(err)
	}
	_ = watcher.Flush()

	for _, tc := range []struct {
		name, user string
		want       []string
	}{
		{"web-2", "web-1", []string{`NATS refused host "web-2" its own subjects`, `NATS user "web-1"`, "--name web-1", "--agent_credential web-2"}},
		{"web-3", "web-3", []string{`NATS refused host "web-3" its own subjects`, `NATS user "web-3" may not use them`, "deploy/nats/cluster-node.conf"}},
	} {
		a, err := New(Config{Servers: []string{ns.ClientURL()}, Name: tc.name, User: tc.user, Password: "p1",
			StateDir: t.TempDir(), Cwd: t.TempDir(), Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- a.Run(context.Background()) }()
		select {
		case err = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Run kept going with a credential NATS refuses the host")
		}
		var refused *JoinRefusedError
		if !errors.As(err, &refused) || !errors.Is(err, nats.ErrPermissionViolation) {
			t.Fatalf("Run = %v, want a JoinRefusedError", err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q does not mention %q", err, w)
			}
		}
	}
	if m, err := announces.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("the refused agent was announced: %s %s", m.Subject, m.Data)
	}
}

// connect gives up on a server that takes the connection and never
// answers as soon as its context ends, instead of after its handshake
// timeout per server.
func TestConnectGivesUpWithContext(t *testing.T) {
	urls, accepted := silentServers(t, 3)
	a := newTestAgent(t, Config{Servers: urls})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := a.connect(ctx, make(chan struct{}))
		done <- err
	}()
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("connect never dialled the servers")
	}
	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("connected to a server that never answered")
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("connect returned %s after its context ended; want at once", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("connect did not return within 10s of its context ending")
	}
}

// silentServers starts n loopback servers that accept connections and
// never write to them, and returns their URLs; accepted gets a value
// when one accepts a connection. They stop with the test.
func silentServers(t *testing.T, n int) (urls []string, accepted <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{}, 1)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
		lns   []net.Listener
	)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		urls = append(urls, "nats://"+ln.Addr().String())
		wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				select {
				case ch <- struct{}{}:
				default:
				}
				wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
			}
		})
	}
	t.Cleanup(func() {
		for _, ln := range lns {
			ln.Close()
		}
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return urls, ch
}
