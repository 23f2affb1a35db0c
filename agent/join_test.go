//go:build unix

package agent

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

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
