//go:build unix

package ha

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/integration/hacheck"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/signing"
	"github.com/fleetmcp/fleetmcp/integration"
)

// TestGatewayKilledMidCall: three gateways of a cluster each serve four
// clients (two of each MCP era) whose calls run on their hosts (real
// agents, each dialling every node) until the test lets them end. While
// every call is on its host, the gateway whose node leads the audit
// stream stops at once, its NATS node with it. Its clients'
// calls fail at once, with an error from their transport; every call
// through the other two is answered with its result, and has exactly one
// audit record, although the stream lost its leader meanwhile. A
// background task started through the stopped gateway, on an agent given
// only that gateway's node (so that it loses its node too, and reconnects
// to one it learnt from the cluster), runs on, and another gateway reads
// it to its end.
func TestGatewayKilledMidCall(t *testing.T) {
	c := startGatewayCluster(t, 3, nil)
	hosts := []string{"kill-1", "kill-2", "kill-3", "kill-4", "kill-5", "kill-6"}
	// Every call runs until this file exists: all of them are on their
	// hosts when the gateway stops, however slowly they started.
	release := filepath.Join(t.TempDir(), "release")
	dirs := map[string]string{}
	for _, h := range hosts {
		dirs[h] = startClusterAgent(t, c.gw(0), h, c.natsURLs())
	}
	for i := range 3 {
		waitOnline(t, c.gw(i), hosts)
	}
	victim := auditLeader(t, c, 0)
	type result struct {
		gw, n      int
		era        string
		tag        string
		err        error
		res        *mcp.CallToolResult
		start, end time.Time
	}
	const perGateway = 4
	var clients []*mcp.ClientSession
	var gwOf []int
	for i := range 3 {
		for n := range perGateway {
			era := "2025-11-25"
			if n%2 == 1 {
				era = ""
			}
			clients = append(clients, clientTo(t, c.gw(i).MCPURL(), era))
			gwOf = append(gwOf, i)
		}
	}
	results := make([]result, len(clients))
	var wg sync.WaitGroup
	for k, cs := range clients {
		results[k] = result{gw: gwOf[k], n: k, era: cs.InitializeResult().ProtocolVersion, tag: fmt.Sprintf("kill-%d", k)}
		wg.Go(func() {
			r := &results[k]
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			r.start = time.Now()
			r.res, r.err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Meta: mcp.Meta{"execution_id": r.tag},
				Arguments: map[string]any{"host": hosts[k%len(hosts)], "command": "touch " + r.tag + "; while [ ! -e " + release + " ]; do sleep 0.05; done; echo " + r.tag}})
			r.end = time.Now()
		})
	}
	// A background task started through the gateway that will stop, on
	// an agent connected to its node.
	const taskHost = "kill-task"
	taskDir := startClusterAgent(t, c.gw(0), taskHost, []string{"nats://" + c.cfgs[victim].NATSListen})
	integration.KillTasksAfter(t, taskDir)
	waitOnline(t, c.gw(victim), []string{taskHost})
	gate := filepath.Join(taskDir, "task-gate")
	taskID, _ := integration.StartBackground(t, clientTo(t, c.gw(victim).MCPURL(), ""), taskHost,
		"while [ ! -e task-gate ]; do sleep 0.05; done; echo task-done", nil)
	integration.WaitFor(t, 20*time.Second, "every call on its host", func() bool {
		for k := range clients {
			if _, err := os.Stat(filepath.Join(dirs[hosts[k%len(hosts)]], fmt.Sprintf("kill-%d", k))); err != nil {
				return false
			}
		}
		return true
	})
	at := time.Now()
	c.stop(victim)
	t.Logf("gateway %d (its node the audit stream's leader) stopped with %d calls on their hosts", victim+1, len(clients))
	released := time.Now()
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	var slowest, lastFail time.Duration
	for _, r := range results {
		switch {
		case r.gw == victim && r.err == nil:
			t.Errorf("call %s through the stopped gateway %d was answered (%s)", r.tag, victim+1, integration.Text(r.res))
		case r.gw == victim:
			lastFail = max(lastFail, r.end.Sub(at))
			t.Logf("call %s (era %s) through the stopped gateway: %v", r.tag, r.era, r.err)
		case r.err != nil:
			t.Errorf("call %s through gateway %d, still up, failed: %v", r.tag, r.gw+1, r.err)
		case r.res.IsError || !strings.Contains(integration.Text(r.res), r.tag):
			t.Errorf("call %s through gateway %d, still up: %s", r.tag, r.gw+1, integration.Text(r.res))
		default:
			slowest = max(slowest, r.end.Sub(released))
		}
	}
	t.Logf("the stopped gateway's clients all saw their calls fail %s after the stop; the slowest call through the others was answered %s after the calls were let end",
		lastFail.Round(time.Millisecond), slowest.Round(time.Millisecond))
	if lastFail > 5*time.Second {
		t.Errorf("the stopped gateway's clients learnt of it after %s; want within 5s", lastFail)
	}

	// Every call through the gateways left has one record; a call of
	// the stopped one has at most one (it ran; its record may or may not
	// have been stored before the gateway went).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	recs, err := hacheck.ReadRecords(ctx, c.conn((victim+1)%3))
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, r := range recs {
		n[r.ExecutionID]++
	}
	stored := 0
	for _, r := range results {
		switch {
		case r.gw != victim && n[r.tag] != 1:
			t.Errorf("call %s, answered through gateway %d, has %d audit records; want 1", r.tag, r.gw+1, n[r.tag])
		case r.gw == victim && n[r.tag] > 1:
			t.Errorf("call %s of the stopped gateway has %d audit records", r.tag, n[r.tag])
		case r.gw == victim:
			stored += n[r.tag]
		}
	}
	t.Logf("%d of the stopped gateway's %d calls have a record", stored, perGateway)

	// The task runs on through the loss of the gateway that started it
	// and of its agent's node, and another replica reads it to its end
	// once the agent has reconnected.
	other := clientTo(t, c.gw((victim+1)%3).MCPURL(), "")
	integration.WaitFor(t, 30*time.Second, "the task read through another gateway", func() bool {
		res, ok := tryCall(other, "task_status", map[string]any{"host": taskHost, "task_id": taskID, "wait": 0})
		st, _ := res.StructuredContent.(map[string]any)
		return ok && st["state"] == "running"
	})
	t.Logf("the task's agent, on the stopped node, reconnected; its task read through gateway %d %s after the stop",
		(victim+1)%3+1, time.Since(at).Round(time.Millisecond))
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if st, res := integration.AwaitTask(t, other, taskHost, taskID); st["state"] != "succeeded" || st["output_tail"] != "task-done\n" {
		t.Errorf("the background task, read through another gateway: %s", integration.Text(res))
	}
}

// startClusterAgent enrols host through gw and runs a real agent for it
// in this process, dialling urls; it returns the agent's working
// directory. The agent stops with the test.
func startClusterAgent(t testing.TB, gw *gateway.Gateway, host string, urls []string) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	creds, err := gw.EnrolLocal(ctx, host, pub, map[string]string{"env": "test"})
	if err != nil {
		t.Fatalf("enrol %s: %v", host, err)
	}
	dir := t.TempDir()
	cfg := agent.Config{
		Servers: urls, Name: host,
		Credentials: agent.Credentials{JWT: func() (string, error) { return creds.JWT, nil }, Seed: seed, CA: creds.CAPEM},
		GatewayKeys: creds.SigningKeys, GatewayKeySerial: creds.SigningKeySerial,
		Cwd: dir, StateDir: filepath.Join(dir, ".state"),
		Heartbeat: 500 * time.Millisecond, Keepalive: 500 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond, DrainTimeout: 5 * time.Second,
		Logger: testLogger(t).With("component", "agent", "host", host),
	}
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("agent %s: %v", host, err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	return dir
}

// TestClusterSigningKeyRotation: a signing-key rotation on an embedded
// cluster, as deploy/README.md tells the operator to make it: rotate on
// one gateway, copy its signing directory to the others, reload each;
// then retire and do the same. The agent takes the new key set in, and
// calls through every replica run throughout. A replica left out of the
// whole rotation still signs with the old key: its calls run while the
// old key is trusted, and after the retirement are refused, saying so,
// until it gets the directory too.
func TestClusterSigningKeyRotation(t *testing.T) {
	c := startGatewayCluster(t, 3, nil)
	startClusterAgent(t, c.gw(0), "rot-1", c.natsURLs())
	for i := range 3 {
		waitOnline(t, c.gw(i), []string{"rot-1"})
	}
	clients := []*mcp.ClientSession{clientTo(t, c.gw(0).MCPURL(), ""), clientTo(t, c.gw(1).MCPURL(), ""), clientTo(t, c.gw(2).MCPURL(), "")}
	callAll := func(what string, gws ...int) {
		t.Helper()
		for _, i := range gws {
			integration.MustOK(t, integration.Call(t, clients[i], "bash", map[string]any{"host": "rot-1", "command": "echo " + what}))
		}
	}
	signingDir := func(i int) string { return filepath.Join(c.cfgs[i].DataDir, "signing") }
	reload := func(gws ...int) {
		t.Helper()
		for _, i := range gws {
			if err := c.gw(i).Reload(); err != nil {
				t.Fatalf("reload gateway %d: %v", i+1, err)
			}
		}
	}
	trusts := func(i int, want []string) func() bool {
		return func() bool {
			h, ok := c.gw(i).Host("rot-1")
			return ok && slices.Equal(h.TrustedKeys, want)
		}
	}
	callAll("before", 0, 1, 2)

	// Rotated on gateway 1 and copied to gateway 2; gateway 3 is left out.
	rep, err := signing.Rotate(filepath.Join(signingDir(0), "gateway.key"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ids := protocol.KeyIDs(rep.Keys)
	copySigningDir(t, signingDir(0), signingDir(1))
	reload(0, 1)
	integration.WaitFor(t, 20*time.Second, "rot-1 to trust both keys", trusts(0, ids))
	callAll("overlap", 0, 1, 2) // gateway 3 signs with the old key, still trusted

	if _, err := signing.Retire(filepath.Join(signingDir(0), "gateway.key"), time.Now()); err != nil {
		t.Fatal(err)
	}
	copySigningDir(t, signingDir(0), signingDir(1))
	reload(0, 1)
	integration.WaitFor(t, 20*time.Second, "rot-1 to retire the old key", trusts(0, ids[:1]))
	callAll("retired", 0, 1)
	res := integration.Call(t, clients[2], "bash", map[string]any{"host": "rot-1", "command": "echo left-out"})
	if !res.IsError || !strings.Contains(integration.Text(res), "does not trust the gateway's signing key") {
		t.Errorf("a call through the gateway left out of the rotation, after the retirement: %s", integration.Text(res))
	}
	t.Logf("a call through the gateway left out of the rotation, after the retirement: %s", integration.Text(res))
	copySigningDir(t, signingDir(0), signingDir(2))
	reload(2)
	callAll("all-retired", 0, 1, 2)
}

// copySigningDir makes dir to a copy of the signing directory from, as
// rsync -a --delete would: the same files, modes and contents.
func copySigningDir(t *testing.T, from, to string) {
	t.Helper()
	have, err := os.ReadDir(to)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range have {
		if _, err := os.Stat(filepath.Join(from, e.Name())); os.IsNotExist(err) {
			if err := os.Remove(filepath.Join(to, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}
	files, err := os.ReadDir(from)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range files {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), data, info.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
}

// tryCall calls tool once with a short deadline; ok reports an answer
// that is not an error. A failed call returns a nil result.
func tryCall(cs *mcp.ClientSession, tool string, args map[string]any) (res *mcp.CallToolResult, ok bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return nil, false
	}
	return res, !res.IsError
}
