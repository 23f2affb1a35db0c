//go:build unix

package integration

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connTracker records every connection an HTTP client dials, so a test can
// cut them all as a network failure would.
type connTracker struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (ct *connTracker) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		ct.mu.Lock()
		ct.conns = append(ct.conns, c)
		ct.mu.Unlock()
	}
	return c, err
}

func (ct *connTracker) cutAll() {
	ct.mu.Lock()
	defer ct.mu.Unlock()
	for _, c := range ct.conns {
		c.Close()
	}
}

// TestClientDisconnectKillsCommand: a client that vanishes mid-call (no
// cancel notification) gets its remote process group killed, in both eras.
func TestClientDisconnectKillsCommand(t *testing.T) {
	env := NewEnv(t)
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			var ct connTracker
			hc := &http.Client{Transport: &http.Transport{DialContext: ct.dial}}
			c := mcp.NewClient(&mcp.Implementation{Name: "vanishing", Version: "1"}, nil)
			cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
				Endpoint: env.Gateway.MCPURL(), HTTPClient: hc, DisableStandaloneSSE: true, MaxRetries: -1,
			}, &mcp.ClientSessionOptions{ProtocolVersion: era.Version})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			pidFile := filepath.Join(env.AgentDir("alpha"), "disconnect-"+era.Name)
			go func() {
				_, _ = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{
					"host": "alpha", "command": fmt.Sprintf("echo $$ > %s; exec sleep 60", pidFile),
				}})
			}()
			var pid int
			waitFor(t, 5*time.Second, "pid file", func() bool {
				data, _ := os.ReadFile(pidFile)
				pid, _ = strconv.Atoi(strings.TrimSpace(string(data)))
				return pid > 0
			})
			waitFor(t, 5*time.Second, "exec to replace the shell with sleep", func() bool {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
				return strings.TrimSpace(string(comm)) == "sleep"
			})
			ct.cutAll()
			waitFor(t, 1500*time.Millisecond, "the command to be killed after the client vanished", func() bool {
				return syscall.Kill(pid, 0) != nil || isZombie(pid)
			})
		})
	}
}
