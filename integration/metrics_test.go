package integration

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
)

// The gateway's metrics move as calls happen through the MCP client:
// calls by tool and outcome, their latency, fan-outs, rate-limit
// refusals, audit write failures, the fleet by state, version and policy,
// and each agent's own counters from its heartbeat.
func TestMetricsMoveWithCalls(t *testing.T) {
	ops, opsLine, err := access.NewAPIToken("ops")
	if err != nil {
		t.Fatal(err)
	}
	slow, slowLine, err := access.NewAPIToken("slow")
	if err != nil {
		t.Fatal(err)
	}
	opsLine = strings.Replace(opsLine, "tools: [read]}", "tools: [read, bash]}", 1)
	slowLine = strings.Replace(slowLine, "tools: [read]}", `tools: [read], rate_limit: "1/h"}`, 1)
	tokens, err := access.ParseAPITokens("tokens.yaml", []byte("tokens:\n  "+opsLine+"\n  "+slowLine+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	env := NewEnv(t, Options{Agents: []string{"alpha", "beta"}, Gateway: func(c *gateway.Config) {
		c.AuthDisabled = false
		c.Auth = access.AuthConfig{APITokens: tokens}
		c.Metrics = true
		c.MetricsListen = "127.0.0.1:0"
		c.Audit.File = "/dev/full" // every write fails: ENOSPC
	}})
	url := env.Gateway.MetricsURL()
	onMCP := strings.TrimSuffix(env.Gateway.MCPURL(), "/mcp") + "/metrics"
	before := scrape(t, url)
	if _, ok := scrape(t, onMCP)[`fleet_hosts{state="online"}`]; !ok {
		t.Fatal("no fleet_hosts on the MCP listener's /metrics")
	}
	served := func(m map[string]float64, host string) float64 {
		return m[`fleet_agent_calls_served_total{host="`+host+`"}`]
	}

	cs := env.ClientAs("2025-11-25", ops)
	for range 3 {
		mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "true"}))
	}
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "exit 3"}), "Command exited with code 3")
	mustErr(t, call(t, cs, "read", map[string]any{"host": "nosuch", "path": "x"}), "unknown host")
	call(t, cs, "fleet_bash", map[string]any{"selector": "*", "command": "true"})
	sl := env.ClientAs("", slow)
	mustOK(t, call(t, sl, "hosts", nil))
	mustErr(t, call(t, sl, "hosts", nil), "rate limit reached")

	var after map[string]float64
	waitFor(t, 10*time.Second, "the agents' counters in their heartbeats", func() bool {
		after = scrape(t, url)
		return served(after, "alpha") >= served(before, "alpha")+5 && served(after, "beta") >= served(before, "beta")+1 &&
			after["fleet_audit_write_failures_total"] > 0
	})
	for series, delta := range map[string]float64{
		`fleet_tool_calls_total{outcome="ok",tool="bash"}`:       3,
		`fleet_tool_calls_total{outcome="error",tool="bash"}`:    1,
		`fleet_tool_calls_total{outcome="refused",tool="read"}`:  1,
		`fleet_tool_calls_total{outcome="refused",tool="hosts"}`: 1,
		`fleet_tool_call_duration_seconds_count{tool="bash"}`:    4,
		`fleet_fanout_hosts_count{tool="fleet_bash"}`:            1,
		`fleet_fanout_hosts_sum{tool="fleet_bash"}`:              2,
		`fleet_fanout_duration_seconds_count{tool="fleet_bash"}`: 1,
		"fleet_rate_limited_total":                               1,
	} {
		if got := after[series] - before[series]; got != delta {
			t.Errorf("%s moved by %v, want %v", series, got, delta)
		}
	}
	for series, want := range map[string]float64{
		`fleet_hosts{state="online"}`:                           2,
		`fleet_hosts{state="offline"}`:                          0,
		`fleet_hosts{state="revoked"}`:                          0,
		`fleet_agent_versions{version="` + agent.Version + `"}`: 2,
		`fleet_host_policies{digest="unrestricted"}`:            2,
		"fleet_nats_connected":                                  1,
		`fleet_agent_queue_depth{host="alpha"}`:                 0,
		`fleet_agent_tasks_running{host="alpha"}`:               0,
	} {
		if got, ok := after[series]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
		}
	}
	if after[`fleet_agent_calls_failed_total{host="alpha"}`] < 1 || after[`fleet_agent_resident_memory_bytes{host="alpha"}`] <= 0 ||
		after["fleet_transfer_bytes_limit"] != float64(gateway.DefaultMaxTransferBytes) {
		t.Errorf("agent failed calls %v, RSS %v, transfer limit %v", after[`fleet_agent_calls_failed_total{host="alpha"}`],
			after[`fleet_agent_resident_memory_bytes{host="alpha"}`], after["fleet_transfer_bytes_limit"])
	}

	env.StopAgent("beta")
	waitFor(t, 10*time.Second, "beta counted offline", func() bool {
		m := scrape(t, url)
		_, stats := m[`fleet_agent_calls_served_total{host="beta"}`]
		return m[`fleet_hosts{state="offline"}`] == 1 && m[`fleet_hosts{state="online"}`] == 1 && !stats
	})
}
