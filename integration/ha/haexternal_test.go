package ha

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/integration/hacheck"
	"github.com/fleetmcp/fleetmcp/integration/simfleet"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/integration"
)

// TestExternalClusterNodeLoss: two gateways on an external 3-node NATS
// cluster (deploy/nats/cluster-node.conf, TLS on clients and routes,
// nodes in this process) with a dozen simulated agents. The node one
// gateway is connected to stops: that gateway and the agents on the node
// reconnect to the others within seconds, and calls through both
// gateways go on. It comes back on its old store and catches up; then
// the node leading the audit stream stops, and calls go on again. No
// call answered is without its record.
func TestExternalClusterNodeLoss(t *testing.T) {
	dir := t.TempDir()
	clients := []int{integration.FreePort(t), integration.FreePort(t), integration.FreePort(t)}
	routes := []int{integration.FreePort(t), integration.FreePort(t), integration.FreePort(t)}
	confs := make([]string, 3)
	for i := range 3 {
		confs[i] = integration.ClusterNodeConf(t, dir, fmt.Sprintf("n%d", i+1), clients[i], routes[i], routes)
	}
	nodes := make([]*server.Server, 3)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() {
			ns := integration.StartNode(t, confs[i])
			mu.Lock()
			nodes[i] = ns
			mu.Unlock()
		})
	}
	wg.Wait()
	var urls []string
	for _, p := range clients {
		urls = append(urls, fmt.Sprintf("tls://127.0.0.1:%d", p))
	}
	setup := filepath.Join(dir, "setup")
	f := gateway.NATSSetupFiles
	gws := make([]*gateway.Gateway, 2)
	for i := range 2 {
		wg.Go(func() {
			gw, err := gateway.Start(t.Context(), gateway.Config{
				Name: fmt.Sprintf("gw%d", i+1), Listen: "127.0.0.1:0", AuthDisabled: true, Silence: 2 * time.Second, OfflineAfter: 3 * time.Second,
				NATSURLs: urls, NATSCAFile: filepath.Join(dir, "tls", "ca.pem"),
				NATSCredsFile: filepath.Join(setup, f.GatewayCreds), NATSSystemCredsFile: filepath.Join(setup, f.SystemCreds),
				NATSAgentSigningKeyFile: filepath.Join(setup, f.AgentSigningKey), NATSOperatorSigningKeyFile: filepath.Join(setup, f.OperatorSigningKey),
				SigningKeyFile: filepath.Join(setup, f.SigningKey),
				Logger:         testLogger(t).With("component", fmt.Sprintf("gateway-%d", i+1)),
			})
			if err != nil {
				t.Errorf("gateway %d: %v", i+1, err)
				return
			}
			gws[i] = gw
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = gw.Shutdown(ctx)
			})
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	hosts := make([]string, 12)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("ext-%02d", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fleet, err := simfleet.Start(ctx, simfleet.Config{
		URL: strings.Join(urls, ","), Hosts: hosts, Heartbeat: 500 * time.Millisecond, SigningKeys: gws[0].SigningKeys(),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond,
		Credentials: func(host string) (simfleet.Credential, error) {
			kp, _ := nkeys.CreateUser()
			pub, _ := kp.PublicKey()
			seed, _ := kp.Seed()
			creds, err := gws[0].EnrolLocal(ctx, host, pub, map[string]string{"env": "test"})
			return simfleet.Credential{JWT: creds.JWT, Seed: seed, CA: creds.CAPEM}, err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	for _, gw := range gws {
		waitOnline(t, gw, hosts)
	}
	clients2 := []*clientLoop{newClientLoop(t, gws[0].MCPURL(), hosts), newClientLoop(t, gws[1].MCPURL(), hosts)}

	// The node gateway 1 is connected to stops.
	victim := nodeOf(t, nodes, "fleet-gateway")
	onVictim := integration.Connections(nodes[victim], "fleet-sim ")
	t.Logf("node n%d holds gateway 1's connection and %d of the agents", victim+1, onVictim)
	at := time.Now()
	nodes[victim].Shutdown()
	nodes[victim].WaitForShutdown()
	for i, cl := range clients2 {
		took := cl.servedAfter(t, at, 20*time.Second)
		t.Logf("node n%d stopped: calls through gateway %d answered again after %s", victim+1, i+1, took.Round(time.Millisecond))
		if took > 10*time.Second {
			t.Errorf("calls through gateway %d stopped for %s after a node's loss; want within 10s", i+1, took)
		}
	}
	// Right after the shutdown the agents may not have noticed it yet:
	// wait for their reconnections, not only for them to be connected.
	integration.WaitFor(t, 20*time.Second, "the agents of the stopped node to reconnect", func() bool {
		return len(fleet.ReconnectedSince(at)) >= onVictim && fleet.Connected() == len(hosts)
	})
	rejoined := fleet.ReconnectedSince(at)
	last := time.Duration(0)
	for _, r := range rejoined {
		last = max(last, r.Sub(at))
	}
	t.Logf("%d agents reconnected to the other nodes, the last after %s", len(rejoined), last.Round(time.Millisecond))
	if len(rejoined) < onVictim || last > 10*time.Second {
		t.Errorf("%d of the %d agents of the stopped node reconnected, the last after %s; want all within 10s", len(rejoined), onVictim, last)
	}
	for _, gw := range gws {
		waitOnline(t, gw, hosts)
	}

	// It comes back on its old store and catches up.
	nodes[victim] = integration.StartNode(t, confs[victim])
	name := fmt.Sprintf("n%d", victim+1)
	nc := operatorConn(t, setup, urls[(victim+1)%3])
	integration.WaitFor(t, 60*time.Second, name+" current on the audit stream", func() bool {
		info, err := streamInfo(nc, protocol.AuditStream)
		if err != nil || info.Cluster == nil {
			return false
		}
		for _, p := range info.Cluster.Replicas {
			if p.Name == name && p.Current {
				return true
			}
		}
		return info.Cluster.Leader == name
	})

	// The audit stream's leader stops.
	info, err := streamInfo(nc, protocol.AuditStream)
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i := range nodes {
		if nodes[i].Name() == info.Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("no node leads the audit stream (%q)", info.Cluster.Leader)
	}
	at = time.Now()
	nodes[leader].Shutdown()
	nodes[leader].WaitForShutdown()
	for i, cl := range clients2 {
		took := cl.servedAfter(t, at, 30*time.Second)
		t.Logf("audit leader n%d stopped: calls through gateway %d answered again after %s", leader+1, i+1, took.Round(time.Millisecond))
		if took > 15*time.Second {
			t.Errorf("calls through gateway %d stopped for %s after the audit leader's loss; want within 15s", i+1, took)
		}
	}
	answered := 0
	for _, cl := range clients2 {
		answered += cl.stop()
	}
	// Every answered call has its record (read from a node still up).
	var reader string
	for i := range nodes {
		if i != leader {
			reader = urls[i]
		}
	}
	rnc := operatorConn(t, setup, reader)
	for _, cl := range clients2 {
		cl.checkRecorded(t, rnc)
	}
	t.Logf("%d calls answered in all", answered)
}

// nodeOf returns the node on which a client named name is connected.
func nodeOf(t *testing.T, nodes []*server.Server, name string) int {
	t.Helper()
	for i, ns := range nodes {
		if integration.Connections(ns, name) > 0 {
			return i
		}
	}
	t.Fatalf("no node has a connection named %q", name)
	return -1
}

// operatorConn connects to url as the external cluster's gateway user.
func operatorConn(t *testing.T, setup, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserCredentials(filepath.Join(setup, gateway.NATSSetupFiles.GatewayCreds)),
		integration.AgentTLS(mustRead(t, filepath.Join(filepath.Dir(setup), "tls", "ca.pem"))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// clientLoop is an MCP client (stateless era) calling bash through one
// gateway without pause, with each call's tag as its execution_id.
type clientLoop struct {
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	calls  []loopCall
}

type loopCall struct {
	tag        string
	start, end time.Time
	ok         bool
}

func newClientLoop(t *testing.T, url string, hosts []string) *clientLoop {
	t.Helper()
	cs := clientTo(t, url, "")
	ctx, cancel := context.WithCancel(context.Background())
	cl := &clientLoop{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(cl.done)
		for i := 0; ctx.Err() == nil; i++ {
			tag := fmt.Sprintf("loop-%p-%d", cl, i)
			c := loopCall{tag: tag, start: time.Now()}
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			res, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "bash", Meta: mcp.Meta{"execution_id": tag},
				Arguments: map[string]any{"host": hosts[i%len(hosts)], "command": "echo " + tag}})
			ccancel()
			c.end = time.Now()
			c.ok = err == nil && !res.IsError
			cl.mu.Lock()
			cl.calls = append(cl.calls, c)
			cl.mu.Unlock()
			if !c.ok {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() { cl.stop() })
	return cl
}

// servedAfter waits until a call started after at is answered, and
// returns how long after at that was.
func (cl *clientLoop) servedAfter(t *testing.T, at time.Time, within time.Duration) time.Duration {
	t.Helper()
	var took time.Duration
	integration.WaitFor(t, within, "a call answered after "+at.Format(time.StampMilli), func() bool {
		cl.mu.Lock()
		defer cl.mu.Unlock()
		for _, c := range cl.calls {
			if c.ok && c.start.After(at) {
				took = c.end.Sub(at)
				return true
			}
		}
		return false
	})
	return took
}

// stop ends the loop and returns how many calls were answered.
func (cl *clientLoop) stop() int {
	cl.cancel()
	<-cl.done
	cl.mu.Lock()
	defer cl.mu.Unlock()
	n := 0
	for _, c := range cl.calls {
		if c.ok {
			n++
		}
	}
	return n
}

// checkRecorded checks that every answered call has exactly one audit
// record.
func (cl *clientLoop) checkRecorded(t *testing.T, nc *nats.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := hacheck.ReadRecords(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, r := range recs {
		n[r.ExecutionID]++
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	for _, c := range cl.calls {
		switch {
		case c.ok && n[c.tag] != 1:
			t.Errorf("call %s was answered and has %d records", c.tag, n[c.tag])
		case n[c.tag] > 1:
			t.Errorf("call %s has %d records", c.tag, n[c.tag])
		}
	}
}
