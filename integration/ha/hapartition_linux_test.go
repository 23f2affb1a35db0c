//go:build linux

package ha

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/integration/hacheck"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/integration"
)

// TestClusterPartition: three gateways whose embedded NATS servers are
// one cluster, the third a fleet-gateway process in a network namespace
// of its own: its routes to the other two go over one veth link, its MCP
// endpoint, fleet API and agents' port over a second. Two real agents
// dial only the first two nodes, one only the third. The first link goes
// down: the third node is alone, a minority. Calls through its gateway to
// the agent it still reaches are refused without running (the audit
// trail cannot record them), an enrolment through it is not
// acknowledged, and its /readyz answers 503 for a load balancer to take
// it out; calls and enrolments through the other two go on once they
// have elected leaders for what the cut-off node led (an enrolment in
// that time is refused as unavailable, for its client to try again). The link
// comes up: the third node catches up on every stream, its gateway
// serves calls again, and every call a client saw answered has exactly
// one audit record. Then its process is killed (SIGKILL) while its node
// leads the audit stream: calls through the other two go on once they
// have elected another leader; started again on its old store, it
// catches up and serves its agent again.
func TestClusterPartition(t *testing.T) {
	if testing.Short() || os.Getenv("FLEET_HA_PARTITION") == "" {
		// Two minutes on a loaded 2-core machine, and its step that moves
		// the audit stream's leadership onto the cut-off node can take
		// longer than it waits there: it runs when asked for.
		t.Skip("a partition of a cluster, about two minutes: run with FLEET_HA_PARTITION=1")
	}
	ns := integration.NewNetNS(t)
	_, nsB := ns.AddLink()
	p := startPartitionCluster(t, ns, nsB)
	majority := []string{"maj-1", "maj-2"}
	for _, h := range majority {
		startClusterAgent(t, p.gws[0], h, p.natsURLs[:2])
	}
	minDir := startClusterAgent(t, p.gws[0], "min-1", []string{p.natsURLs[2]})
	all := append(slices.Clone(majority), "min-1")
	for _, gw := range p.gws {
		waitOnline(t, gw, all)
	}
	cs3 := p.client(t)
	integration.WaitFor(t, 30*time.Second, "gateway 3 to list every host online", func() bool {
		for _, h := range all {
			if !integration.HostOnline(cs3, h) {
				return false
			}
		}
		return true
	})
	for _, h := range all {
		integration.MustOK(t, integration.Call(t, cs3, "bash", map[string]any{"host": h, "command": "echo before"}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tok, err := p.gws[0].CreateJoinToken(ctx, &protocol.TokenCreateRequest{Uses: 10, TTL: "1h"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	nc := p.conn(t, 0)
	// The audit stream's leader is the node to be cut off: the majority
	// must elect another while its calls wait.
	leadFrom(t, nc, protocol.AuditStream, "gw3")
	loops := []*clientLoop{newClientLoop(t, p.gws[0].MCPURL(), majority), newClientLoop(t, p.gws[1].MCPURL(), majority)}

	// The routes' link goes down.
	ns.SetLink(false)
	at := time.Now()
	// The minority, meanwhile: calls are refused, not run.
	var withheld []string
	refusedAfter := time.Duration(-1)
	minorityDone := make(chan struct{})
	t.Cleanup(func() { <-minorityDone }) // should the test end early
	go func() {
		defer close(minorityDone)
		for i := 0; refusedAfter < 0 && time.Since(at) < 90*time.Second; i++ {
			tag := fmt.Sprintf("minority-%d", i)
			cctx, ccancel := context.WithTimeout(ctx, 40*time.Second)
			res, err := cs3.CallTool(cctx, &mcp.CallToolParams{Name: "bash", Meta: mcp.Meta{"execution_id": tag},
				Arguments: map[string]any{"host": "min-1", "command": "touch " + tag + "; echo " + tag}})
			ccancel()
			outcome, msg := hacheck.Classify(res, err, tag)
			_, statErr := os.Stat(filepath.Join(minDir, tag))
			ran := statErr == nil
			t.Logf("call %s through gateway 3 (minority), %s after the partition: %s (ran on its host: %v): %s",
				tag, time.Since(at).Round(time.Millisecond), outcome, ran, msg)
			switch outcome {
			case hacheck.OK:
				t.Errorf("call %s through the minority's gateway was answered: a result the audit trail's quorum never acknowledged", tag)
			case hacheck.Refused:
				refusedAfter = time.Since(at)
				if ran {
					t.Errorf("call %s was refused yet ran on its host", tag)
				}
			case hacheck.Withheld:
				withheld = append(withheld, tag)
			}
		}
	}()
	for i, cl := range loops {
		took := cl.servedAfter(t, at, 30*time.Second)
		t.Logf("partitioned: calls through gateway %d (majority) answered again after %s", i+1, took.Round(time.Millisecond))
		if took > 15*time.Second {
			t.Errorf("calls through gateway %d, in the majority, stopped for %s; want within 15s", i+1, took)
		}
	}
	// An enrolment through the majority: refused as unavailable while the
	// buckets it writes elect leaders, as a retry later succeeds. The
	// retries send the same key, as an agent does.
	majKey, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	enrolStart := time.Now()
	for tries := 1; ; tries++ {
		err := enrolThroughAs(ctx, p.gws[1].APIURL(), tok.CAPin, tok.Token, "maj-enrolled", majKey)
		if err == nil {
			t.Logf("an enrolment through gateway 2, in the majority, acknowledged %s after the partition (attempt %d)", time.Since(at).Round(time.Millisecond), tries)
			break
		}
		var apiErr *protocol.APIError
		if !errors.As(err, &apiErr) || apiErr.Code != protocol.APIUnavailable || time.Since(enrolStart) > 30*time.Second {
			t.Errorf("an enrolment through gateway 2, in the majority, during the partition (attempt %d): %v", tries, err)
			break
		}
		t.Logf("an enrolment through gateway 2, in the majority, %s after the partition: %v", time.Since(at).Round(time.Millisecond), err)
		time.Sleep(time.Second) // "try again in a moment"
	}

	<-minorityDone
	if refusedAfter < 0 {
		t.Fatal("no call through the minority's gateway was refused within 90s of the partition")
	}
	t.Logf("the minority's gateway refused calls from %s after the partition on", refusedAfter.Round(time.Millisecond))
	enrolErr := enrolThrough(ctx, "https://"+p.api3, tok.CAPin, tok.Token, "min-enrolled")
	var refused interface{ Refused() bool }
	definite := errors.As(enrolErr, &refused) && refused.Refused()
	t.Logf("an enrolment through the minority's gateway: %v (a definite refusal: %v)", enrolErr, definite)
	if enrolErr == nil {
		t.Error("an enrolment through the minority's gateway was acknowledged")
	}
	integration.WaitFor(t, 20*time.Second, "the minority's gateway to answer /readyz with 503", func() bool {
		return p.readyz() == http.StatusServiceUnavailable
	})

	// The link comes up again.
	ns.SetLink(true)
	healed := time.Now()
	integration.WaitFor(t, 60*time.Second, "gw3 current on every stream", func() bool { return streamsCurrent(nc, "gw3") })
	t.Logf("healed: gw3 current on every stream after %s", time.Since(healed).Round(time.Millisecond))
	integration.WaitFor(t, 30*time.Second, "gateway 3 to serve calls again", func() bool {
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		defer ccancel()
		res, err := cs3.CallTool(cctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "maj-1", "command": "echo after"}})
		return err == nil && !res.IsError
	})
	t.Logf("healed: gateway 3 served a call again after %s", time.Since(healed).Round(time.Millisecond))
	integration.WaitFor(t, 20*time.Second, "gateway 3 to answer /readyz with 200", func() bool { return p.readyz() == http.StatusOK })

	// Gateway 3's process is killed while its node leads the audit
	// stream: a crash hands nothing over.
	leadFrom(t, nc, protocol.AuditStream, "gw3")
	killed := time.Now()
	p.kill3()
	for i, cl := range loops {
		took := cl.servedAfter(t, killed, 30*time.Second)
		t.Logf("gateway 3 killed: calls through gateway %d answered again after %s", i+1, took.Round(time.Millisecond))
		if took > 30*time.Second {
			t.Errorf("calls through gateway %d stopped for %s after the audit leader's node was killed; want within 30s", i+1, took)
		}
	}
	// It starts again on its old store, catches up and serves.
	restarted := time.Now()
	p.start3(t)
	integration.WaitFor(t, 60*time.Second, "gw3 current on every stream after its restart", func() bool { return streamsCurrent(nc, "gw3") })
	t.Logf("gateway 3 restarted on its old store: current on every stream %s after its start", time.Since(restarted).Round(time.Millisecond))
	cs3 = p.client(t)
	integration.WaitFor(t, 30*time.Second, "min-1 online at gateway 3 again", func() bool { return integration.HostOnline(cs3, "min-1") })
	integration.MustOK(t, integration.Call(t, cs3, "bash", map[string]any{"host": "min-1", "command": "echo back"}))
	answered := 0
	for _, cl := range loops {
		answered += cl.stop()
	}
	for _, cl := range loops {
		cl.checkRecorded(t, nc)
	}
	// A withheld call ran; its record is stored once the stream is back.
	recs, err := hacheck.ReadRecords(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, r := range recs {
		n[r.ExecutionID]++
	}
	for _, tag := range withheld {
		if n[tag] != 1 {
			t.Errorf("call %s, withheld by the minority's gateway, has %d audit records after the partition; want 1", tag, n[tag])
		}
	}
	agents, err := p.gws[0].Agents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	enrolled := map[string]bool{}
	for _, a := range agents {
		enrolled[a.Host] = true
	}
	if !enrolled["maj-enrolled"] {
		t.Error("the enrolment acknowledged through the majority is not in the agent records")
	}
	if definite && enrolled["min-enrolled"] {
		t.Error("the enrolment the minority refused is in the agent records")
	}
	t.Logf("%d calls answered through the majority during the run, %d withheld by the minority", answered, len(withheld))
}

// partitionCluster is the cluster of TestClusterPartition: gateways 1
// and 2 in this process, their routes on this side of the namespace's
// first link, and gateway 3, a process in the namespace.
type partitionCluster struct {
	gws      []*gateway.Gateway // 1 and 2
	dataDirs []string
	natsURLs []string // the three nodes' client URLs
	mcp3     string   // gateway 3's MCP host:port
	api3     string
	token    string // gateway 3's callers' token
	ns       *integration.NetNS
	args3    []string
	kill3    func() // kills gateway 3's process (SIGKILL) and waits for it
}

func startPartitionCluster(t *testing.T, ns *integration.NetNS, nsB string) *partitionCluster {
	t.Helper()
	p := &partitionCluster{}
	token, line, err := access.NewAPIToken("operator")
	if err != nil {
		t.Fatal(err)
	}
	p.token = token
	tokens := filepath.Join(t.TempDir(), "api-tokens.yaml")
	integration.WriteFile(t, tokens, "tokens:\n  "+strings.Replace(line, "tools: [read]", `tools: ["*"], admin: true`, 1)+"\n")
	// Ports in the namespace are free: nothing else listens there.
	routeAddrs := []string{
		net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP))),
		net.JoinHostPort(ns.HostIP, strconv.Itoa(integration.FreePortOn(t, ns.HostIP))),
		net.JoinHostPort(ns.NSIP, strconv.Itoa(integration.FreePort(t))),
	}
	var routes []string
	for _, a := range routeAddrs {
		routes = append(routes, "nats-route://"+a)
	}
	var cfgs []gateway.Config
	for i := range 2 {
		cfgs = append(cfgs, gateway.Config{
			Name: fmt.Sprintf("gw%d", i+1), Listen: fmt.Sprintf("127.0.0.1:%d", integration.FreePort(t)), DataDir: t.TempDir(),
			NATSListen: fmt.Sprintf("127.0.0.1:%d", integration.FreePort(t)), APIListen: fmt.Sprintf("127.0.0.1:%d", integration.FreePort(t)),
			AuthDisabled: true, Silence: 2 * time.Second, OfflineAfter: 3 * time.Second,
			// TLS for agents as beyond loopback, as gateway 3 serves it:
			// enrolments through this gateway hand out the fleet CA.
			NATSTLS: true,
			Cluster: gateway.ClusterConfig{Name: "fleet", Listen: routeAddrs[i], Routes: routes, Wait: time.Minute},
			Logger:  testLogger(t).With("component", fmt.Sprintf("gateway-%d", i+1)),
		})
		p.dataDirs = append(p.dataDirs, cfgs[i].DataDir)
		p.natsURLs = append(p.natsURLs, "tls://"+cfgs[i].NATSListen)
	}
	p.gws = make([]*gateway.Gateway, 2)
	var mu sync.Mutex
	errs := make(chan error, 2)
	start := func(i int) {
		gw, err := gateway.Start(context.Background(), cfgs[i])
		if err == nil {
			mu.Lock()
			p.gws[i] = gw
			mu.Unlock()
			t.Cleanup(func() {
				sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = gw.Shutdown(sctx)
			})
		}
		errs <- err
	}
	go start(0)
	integration.WaitFor(t, 20*time.Second, "the first gateway's keys", func() bool {
		for _, f := range []string{"nats/agent-signer.nk", "tls/ca.key", "tls/ca.pem", "signing/gateway.key"} {
			if _, err := os.Stat(filepath.Join(cfgs[0].DataDir, f)); err != nil {
				return false
			}
		}
		return true
	})
	dir3 := t.TempDir()
	for _, to := range []string{cfgs[1].DataDir, dir3} {
		if _, err := gateway.SeedReplica(cfgs[0].DataDir, to); err != nil {
			t.Fatal(err)
		}
	}
	p.dataDirs = append(p.dataDirs, dir3)
	go start(1)
	p.mcp3 = net.JoinHostPort(nsB, strconv.Itoa(integration.FreePort(t)))
	p.api3 = net.JoinHostPort(nsB, strconv.Itoa(integration.FreePort(t)))
	nats3 := net.JoinHostPort(nsB, strconv.Itoa(integration.FreePort(t)))
	p.natsURLs = append(p.natsURLs, "tls://"+nats3)
	p.ns = ns
	p.args3 = []string{"--name", "gw3", "--listen", p.mcp3, "--nats_listen", nats3, "--api_listen", p.api3,
		"--data_dir", dir3, "--log_level", "warn", "--api_tokens", tokens,
		"--nats_cluster", "fleet", "--nats_cluster_listen", routeAddrs[2], "--nats_routes", strings.Join(routes, ",")}
	p.start3(t)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// start3 starts gateway 3 in the namespace (again: on its old store) and
// waits until it answers; it is stopped with the test.
func (p *partitionCluster) start3(t *testing.T) {
	t.Helper()
	cmd := p.ns.Command(integration.GatewayBinary(t), p.args3...)
	cmd.Stderr = integration.TestLog(t)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start gateway 3 in %s: %v", p.ns.Name, err)
	}
	done := integration.WaitProcess(cmd)
	p.kill3 = func() {
		_ = cmd.Process.Kill()
		<-done
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	integration.WaitFor(t, 60*time.Second, "gateway 3 to answer /healthz", func() bool {
		resp, err := http.Get("http://" + p.mcp3 + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// client is an MCP client (the stateless era) of gateway 3.
func (p *partitionCluster) client(t *testing.T) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "fleet-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + p.mcp3 + "/mcp", HTTPClient: integration.BearerClient(p.token),
		DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatalf("connect to gateway 3: %v", err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// readyz returns the status of gateway 3's /readyz (0: no answer).
func (p *partitionCluster) readyz() int {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.mcp3 + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// conn connects to node i as the fleet's operator would.
func (p *partitionCluster) conn(t *testing.T, i int) *nats.Conn {
	t.Helper()
	nc, err := hacheck.OperatorConn(p.dataDirs[i], []string{p.natsURLs[i]}, nats.RootCAs(filepath.Join(p.dataDirs[i], "tls", "ca.pem")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// leadFrom makes node the leader of stream, asking the leader to step
// down in its favour until it is.
func leadFrom(t *testing.T, nc *nats.Conn, stream, node string) {
	t.Helper()
	answer, seen, led := "none sent", "", false
	defer func() { // waitFor's Fatalf ends the test's goroutine: say why
		if !led {
			t.Logf("%s led %s at the last look; the last stepdown request in favour of %s was answered: %s", seen, stream, node, answer)
		}
	}()
	integration.WaitFor(t, 30*time.Second, node+" to lead "+stream, func() bool {
		info, err := streamInfo(nc, stream)
		if err != nil || info.Cluster == nil {
			return false
		}
		if info.Cluster.Leader == node {
			return true
		}
		seen = info.Cluster.Leader
		msg, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, []byte(`{"placement":{"preferred":"`+node+`"}}`), 2*time.Second)
		if err != nil {
			answer = err.Error()
		} else {
			answer = string(msg.Data)
		}
		return false
	})
	led = true
}
