package integration

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// listedHost is a host as the hosts tool's structured output shows it.
type listedHost struct {
	Host     string            `json:"host"`
	Online   bool              `json:"online"`
	Labels   map[string]string `json:"labels"`
	Tools    []string          `json:"tools"`
	OS       string            `json:"os"`
	Cwd      string            `json:"cwd"`
	LastSeen time.Time         `json:"last_seen"`
}

// listHosts calls the hosts tool with filter.
func listHosts(t *testing.T, cs *mcp.ClientSession, filter string) []listedHost {
	t.Helper()
	args := map[string]any{}
	if filter != "" {
		args["filter"] = filter
	}
	res := call(t, cs, "hosts", args)
	mustOK(t, res)
	data, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Hosts []listedHost }
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("hosts structured content %s: %v", data, err)
	}
	return out.Hosts
}

func sameHost(a, b listedHost) bool {
	return a.Host == b.Host && a.Online == b.Online && maps.Equal(a.Labels, b.Labels) &&
		slices.Equal(a.Tools, b.Tools) && a.OS == b.OS && a.Cwd == b.Cwd
}

// TestRegistrySharedBetweenGateways: two gateway replicas on one NATS
// cluster list the same hosts; a replica started after a host went away
// still lists it, offline, with its labels; a host that stops
// heartbeating is offline on every replica within the documented bound;
// and at steady state, calls running and all, nothing is written to the
// hosts bucket.
func TestRegistrySharedBetweenGateways(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true})
	env.Label("beta", map[string]string{"role": "db", "region": "eu-west"})
	env.StartAgent("beta", nil)
	env.Label("gamma", map[string]string{"role": "web", "region": "us-east"})
	env.StartAgentProcess("gamma")
	gw1 := env.Gateway
	gw2 := env.StartGateway(nil)
	for _, gw := range []*gateway.Gateway{gw1, gw2} {
		for _, h := range []string{"alpha", "beta", "gamma"} {
			env.WaitHostOn(gw, h, true)
		}
	}
	c1, c2 := env.Client("2025-11-25", nil), env.ClientTo(gw2, "", nil)

	l1, l2 := listHosts(t, c1, ""), listHosts(t, c2, "")
	if len(l1) != 3 || len(l2) != 3 {
		t.Fatalf("gateway 1 lists %v, gateway 2 %v; want alpha, beta, gamma on both", l1, l2)
	}
	for i := range l1 {
		if !sameHost(l1[i], l2[i]) {
			t.Errorf("the gateways disagree:\n1: %+v\n2: %+v", l1[i], l2[i])
		}
	}
	for _, cs := range []*mcp.ClientSession{c1, c2} {
		if l := listHosts(t, cs, "region in (eu-*, ap-*), role != web"); len(l) != 1 || l[0].Host != "beta" {
			t.Errorf("filter region in (eu-*, ap-*), role != web: %+v, want beta", l)
		}
	}

	// Steady state: count every message sent to the bucket (writes and
	// refused attempts alike) while a call keeps an agent's busy count
	// changing across heartbeats.
	nc := env.GatewayConn()
	var kvMsgs atomic.Int64
	sub, err := nc.Subscribe("$KV."+protocol.HostsBucket+".>", func(*nats.Msg) { kvMsgs.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitQuiet(t, &kvMsgs, time.Second)
	before := kvMsgs.Load()
	const window = 3 * time.Second
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err := c1.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "alpha", "command": "sleep 2"}})
		if err != nil || res.IsError {
			t.Errorf("bash sleep 2: %v %v", err, res)
		}
	}()
	time.Sleep(window)
	<-done
	steady := kvMsgs.Load() - before
	t.Logf("hosts bucket at steady state: %d messages in %s (%d hosts, 500 ms heartbeats, two gateways)", steady, window, 3)
	if steady != 0 {
		t.Errorf("%d messages to the hosts bucket in %s of steady state; want none", steady, window)
	}

	// beta leaves. A replica started afterwards knows it from the bucket.
	env.StopAgent("beta")
	env.WaitHostOn(gw1, "beta", false)
	env.WaitHostOn(gw2, "beta", false)
	gw3 := env.StartGateway(nil)
	h, ok := gw3.Host("beta")
	switch {
	case !ok:
		t.Fatal("a gateway started after beta left does not know beta")
	case h.Online:
		t.Error("the new gateway shows beta online")
	case h.Labels["role"] != "db" || h.Labels["region"] != "eu-west":
		t.Errorf("the new gateway shows beta with labels %v", h.Labels)
	case time.Since(h.LastSeen) > time.Minute:
		t.Errorf("the new gateway shows beta last seen %v", h.LastSeen)
	}
	c3 := env.ClientTo(gw3, "", nil)
	if l := listHosts(t, c3, "role=db"); len(l) != 1 || l[0].Host != "beta" || l[0].Online {
		t.Errorf("hosts role=db on the new gateway: %+v, want beta offline", l)
	}
	res := call(t, c3, "bash", map[string]any{"host": "beta", "command": "true"})
	mustErr(t, res, "offline")

	// gamma dies without a goodbye: offline everywhere within the bound
	// (max(OfflineAfter, 3 heartbeats) = 3 s here).
	env.WaitHostOn(gw3, "gamma", true)
	bound := 3 * time.Second
	killed := time.Now()
	env.KillAgent("gamma")
	offlineAt := map[*gateway.Gateway]time.Duration{}
	deadline := killed.Add(3 * bound)
	for len(offlineAt) < 3 && time.Now().Before(deadline) {
		for _, gw := range []*gateway.Gateway{gw1, gw2, gw3} {
			if _, seen := offlineAt[gw]; !seen {
				if h, _ := gw.Host("gamma"); !h.Online {
					offlineAt[gw] = time.Since(killed)
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, gw := range []*gateway.Gateway{gw1, gw2, gw3} {
		took, ok := offlineAt[gw]
		switch {
		case !ok:
			t.Errorf("gateway %d still shows gamma online %s after it was killed", i+1, 3*bound)
		case took > bound+500*time.Millisecond:
			t.Errorf("gateway %d showed gamma offline %s after it was killed; the bound is %s", i+1, took.Round(time.Millisecond), bound)
		case took < bound-time.Second:
			t.Errorf("gateway %d showed gamma offline after only %s (last heartbeat at most 500 ms before the kill, bound %s)", i+1, took.Round(time.Millisecond), bound)
		default:
			t.Logf("gateway %d: gamma offline %s after the kill", i+1, took.Round(time.Millisecond))
		}
	}
}

// waitQuiet waits until counter has not moved for quiet.
func waitQuiet(t *testing.T, counter *atomic.Int64, quiet time.Duration) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	last, since := counter.Load(), time.Now()
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			t.Fatalf("the hosts bucket never went quiet (%d messages)", counter.Load())
		}
		time.Sleep(20 * time.Millisecond)
		if n := counter.Load(); n != last {
			last, since = n, time.Now()
		}
	}
}
