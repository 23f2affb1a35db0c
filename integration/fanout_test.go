package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/integration/simfleet"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// fanoutHost is one host's entry in a fan-out's structuredContent.
type fanoutHost struct {
	Host       string `json:"host"`
	Status     string `json:"status"`
	ExitCode   *int   `json:"exit_code"`
	Reason     string `json:"reason"`
	SHA256     string `json:"sha256"`
	FullOutput string `json:"full_output"`
}

type fanoutResult struct {
	Total    int            `json:"total"`
	Counts   map[string]int `json:"counts"`
	Versions []struct {
		SHA256 string `json:"sha256"`
		Hosts  int    `json:"hosts"`
	} `json:"versions"`
	Hosts []fanoutHost `json:"hosts"`
}

func fanoutOf(t *testing.T, res *mcp.CallToolResult) (fanoutResult, map[string]fanoutHost) {
	t.Helper()
	data, _ := json.Marshal(res.StructuredContent)
	var fr fanoutResult
	if err := json.Unmarshal(data, &fr); err != nil {
		t.Fatalf("fan-out structuredContent %.300s: %v\n%s", data, err, text(res))
	}
	by := map[string]fanoutHost{}
	for _, h := range fr.Hosts {
		by[h.Host] = h
	}
	return fr, by
}

// stagingHost starts an in-process agent that the staging rules cover and
// writes its act.sh, the script the fan-outs below run on every host.
func stagingHost(t *testing.T, env *Env, name, act string, mod func(*agent.Config)) {
	t.Helper()
	env.Label(name, map[string]string{"env": "staging"})
	env.StartAgent(name, func(c *agent.Config) {
		writeFile(t, filepath.Join(c.Cwd, "act.sh"), act)
		if mod != nil {
			mod(c)
		}
	})
	env.WaitHost(name, true)
}

// Every bucket from a real cause: a command that succeeds, one that
// exits non-zero, one that times out, an agent killed before the call, a
// host whose policy refuses bash, a host the caller's rules refuse bash
// on; a host the caller may not see is not matched at all. The audit
// trail has one record per host and one for the fan-out.
func TestFanoutBuckets(t *testing.T) {
	f := newAuthFleet(t)
	writeFile(t, filepath.Join(f.AgentDir("alpha"), "act.sh"), "echo alpha fine\n")
	writeFile(t, filepath.Join(f.AgentDir("beta"), "act.sh"), "echo beta ran\n")
	stagingHost(t, f.Env, "failer", "echo about to fail; exit 3\n", nil)
	stagingHost(t, f.Env, "sleeper", "sleep 30\n", nil)
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, policyFile, "tools: {deny: [bash]}\n")
	stagingHost(t, f.Env, "guarded", "echo never\n", func(c *agent.Config) { c.PolicyFile = policyFile })
	stagingHost(t, f.Env, "leaver", "echo never\n", nil)
	f.StopAgent("leaver") // a goodbye: the gateway knows it offline
	f.WaitHost("leaver", false)
	f.Label("victim", map[string]string{"env": "staging"})
	f.StartAgentProcess("victim")
	f.WaitHost("victim", true)
	f.KillAgent("victim") // no goodbye: the gateway still thinks it online

	dev := f.ClientAs("2025-11-25", f.user("dev"))
	start := time.Now()
	res := call(t, dev, "fleet_bash", map[string]any{"selector": "*", "command": "bash ./act.sh", "timeout": 1})
	took := time.Since(start)
	fr, by := fanoutOf(t, res)
	out := text(res)
	t.Logf("fleet_bash took %s:\n%s", took, out)
	if !res.IsError {
		t.Errorf("a fan-out with failed hosts is not an error")
	}
	want := map[string]string{
		"alpha": "succeeded", "failer": "failed", "sleeper": "timed_out", "victim": "offline", "leaver": "offline",
		"guarded": "denied", "beta": "denied",
	}
	for host, status := range want {
		if by[host].Status != status {
			t.Errorf("%s: %s (%s), want %s", host, by[host].Status, by[host].Reason, status)
		}
	}
	if fr.Total != len(want) || len(fr.Hosts) != len(want) {
		t.Errorf("%d hosts matched, want %d: %+v", fr.Total, len(want), fr.Hosts)
	}
	if _, ok := by["gamma"]; ok || strings.Contains(out, "gamma") {
		t.Errorf("gamma, which dev may not see, was matched:\n%s", out)
	}
	if c := by["failer"].ExitCode; c == nil || *c != 3 {
		t.Errorf("failer's exit code %v, want 3", c)
	}
	if !strings.Contains(by["guarded"].Reason, "host policy") || !strings.Contains(by["beta"].Reason, "no-bash-on-beta") {
		t.Errorf("denied reasons: guarded %q, beta %q", by["guarded"].Reason, by["beta"].Reason)
	}
	for _, s := range []string{
		"1 succeeded, 1 failed, 1 timed_out, 2 offline, 2 denied, 0 not_started",
		"--- offline — 1 host: leaver — offline: last seen ",
		"--- offline, not connected — 1 host: victim — host victim is not connected",
		"--- failed, exit 3 — 1 host: failer ---\nabout to fail\n",
		"alpha fine",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("result lacks %q", s)
		}
	}
	// The offline host was not waited on: the call took about the
	// sleeper's timeout, not the silence timeout of a dead host.
	if took > 8*time.Second {
		t.Errorf("fan-out took %s", took)
	}

	ops := f.ClientAs("", f.user("ops"))
	waitFor(t, 5*time.Second, "the fan-out's audit record", func() bool {
		return len(auditRecords(t, ops, map[string]any{"tool": "fleet_bash"})) == 1
	})
	parent := auditRecords(t, ops, map[string]any{"tool": "fleet_bash"})[0]
	if parent.Fanout["failed"] != 1 || parent.Fanout["denied"] != 2 || parent.Caller.Email != "dev@example.com" {
		t.Errorf("fan-out record: %+v", parent)
	}
	for host, outcome := range map[string]string{"alpha": "ok", "failer": "error", "sleeper": "timed_out", "beta": "refused", "guarded": "refused", "victim": "error", "leaver": "error"} {
		recs := auditRecords(t, ops, map[string]any{"tool": "bash", "host": host})
		if len(recs) != 1 || recs[0].Parent != parent.CallID || recs[0].Outcome != outcome {
			t.Errorf("audit of %s: %+v, want one record with outcome %s and parent %s", host, recs, outcome, parent.CallID)
		}
	}
	if recs := auditRecords(t, ops, map[string]any{"tool": "bash", "host": "beta"}); len(recs) == 1 && recs[0].Rule != "no-bash-on-beta" {
		t.Errorf("beta's refusal names rule %q", recs[0].Rule)
	}
	if recs := auditRecords(t, ops, map[string]any{"tool": "bash", "host": "alpha"}); len(recs) == 1 && (recs[0].Rule != "staging-devs" || recs[0].Args["command"] != "bash ./act.sh") {
		t.Errorf("alpha's record: rule %q, args %v", recs[0].Rule, recs[0].Args)
	}
}

// A host that goes silent mid-run is failed with the reason, while the
// others finish.
func TestFanoutHostDiesMidRun(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	env.StartAgent("steady", nil)
	env.WaitHost("steady", true)
	writeFile(t, filepath.Join(env.AgentDir("steady"), "act.sh"), "sleep 1; echo done\n")
	env.StartAgentProcess("victim")
	env.WaitHost("victim", true)
	writeFile(t, filepath.Join(env.AgentDir("victim"), "act.sh"), "echo running > started; sleep 30\n")
	// The agent's state directory lies in its working directory, where
	// confined commands may change what exists but make nothing new.
	writeFile(t, filepath.Join(env.AgentDir("victim"), "started"), "")
	cs := env.Client("2025-11-25", nil)
	done := callAsync(cs, "fleet_bash", map[string]any{"selector": "*", "command": "bash ./act.sh"})
	waitForFile(t, filepath.Join(env.AgentDir("victim"), "started"))
	env.KillAgent("victim")
	res := awaitCall(t, done, 30*time.Second)
	_, by := fanoutOf(t, res)
	if by["steady"].Status != "succeeded" || by["victim"].Status != "failed" || !strings.Contains(by["victim"].Reason, "silent") {
		t.Errorf("steady %+v, victim %+v", by["steady"], by["victim"])
	}
}

// max_errors stops dispatch: with one host at a time, the first two
// failures leave the rest not started, and none of them ran.
func TestFanoutMaxErrors(t *testing.T) {
	names := []string{"h1", "h2", "h3", "h4", "h5", "h6"}
	env := NewEnv(t, Options{Agents: names})
	cs := env.Client("", nil)
	res := call(t, cs, "fleet_bash", map[string]any{"selector": "h*", "command": "touch ran; exit 1", "max_concurrency": 1, "max_errors": 2})
	fr, by := fanoutOf(t, res)
	if fr.Counts["failed"] != 2 || fr.Counts["not_started"] != 4 {
		t.Fatalf("counts %v:\n%s", fr.Counts, text(res))
	}
	for i, h := range names {
		_, err := os.Stat(filepath.Join(env.AgentDir(h), "ran"))
		ran := err == nil
		if ran != (i < 2) || (i >= 2) != (by[h].Status == "not_started") {
			t.Errorf("%s: ran %v, status %s", h, ran, by[h].Status)
		}
	}
	if !strings.Contains(text(res), "--- not_started, max_errors reached — 4 hosts: h3..h6 ---") {
		t.Errorf("result:\n%s", text(res))
	}
}

// max_concurrency is respected, measured on the hosts: each command logs
// its start and end in a shared file. Progress reports hosts done out of
// the total.
func TestFanoutMaxConcurrency(t *testing.T) {
	var names []string
	for i := range 9 {
		names = append(names, fmt.Sprintf("c%d", i))
	}
	env := NewEnv(t, Options{Agents: names})
	logFile := filepath.Join(t.TempDir(), "spans.log")
	var pl progressLog
	cs := env.Client("2025-11-25", &mcp.ClientOptions{ProgressNotificationHandler: pl.Handler})
	params := &mcp.CallToolParams{Name: "fleet_bash", Arguments: map[string]any{
		"selector": "c*", "max_concurrency": 3,
		"command": fmt.Sprintf("echo start $(date +%%s%%N) >> %s; sleep 0.5; echo end $(date +%%s%%N) >> %s", logFile, logFile),
	}}
	params.SetProgressToken("fan")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if fr, _ := fanoutOf(t, res); fr.Counts["succeeded"] != len(names) {
		t.Fatalf("counts %v", fr.Counts)
	}
	data, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	type event struct {
		at    int64
		delta int
	}
	var events []event
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		kind, at, _ := strings.Cut(line, " ")
		n, err := strconv.ParseInt(at, 10, 64)
		if err != nil {
			t.Fatalf("log line %q", line)
		}
		events = append(events, event{n, map[string]int{"start": 1, "end": -1}[kind]})
	}
	sort.Slice(events, func(i, j int) bool {
		return events[i].at < events[j].at || events[i].at == events[j].at && events[i].delta < events[j].delta
	})
	running, most := 0, 0
	for _, e := range events {
		running += e.delta
		most = max(most, running)
	}
	t.Logf("at most %d commands ran at once (max_concurrency 3)", most)
	if len(events) != 2*len(names) || most > 3 || most < 2 {
		t.Errorf("%d events, at most %d at once; want 18 events and 2 to 3 at once", len(events), most)
	}
	// Notifications reach the client's handler asynchronously.
	waitFor(t, 5*time.Second, "the final 9/9 progress", func() bool { return strings.Contains(pl.Joined(), "9/9 hosts done") })
}

// fleet_read groups hosts by the SHA-256 their agents report and shows
// each version once.
func TestFleetRead(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{"web-1", "web-2", "web-3", "web-4"}})
	for h, content := range map[string]string{"web-1": "listen 80;\n", "web-2": "listen 80;\n", "web-3": "listen 8080;\n"} {
		writeFile(t, filepath.Join(env.AgentDir(h), "nginx.conf"), content)
	}
	cs := env.Client("", nil)
	res := call(t, cs, "fleet_read", map[string]any{"selector": "web-*", "path": "nginx.conf"})
	fr, by := fanoutOf(t, res)
	out := text(res)
	sum := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }
	common, odd := sum("listen 80;\n"), sum("listen 8080;\n")
	if fr.Counts["succeeded"] != 3 || by["web-4"].Status != "failed" || len(fr.Versions) != 2 ||
		fr.Versions[0].SHA256 != common || fr.Versions[0].Hosts != 2 || by["web-3"].SHA256 != odd {
		t.Fatalf("counts %v, versions %+v:\n%s", fr.Counts, fr.Versions, out)
	}
	for _, s := range []string{
		"2 distinct versions: " + common[:12] + " on 2 hosts, " + odd[:12] + " on 1 host",
		"--- version 1 of 2: sha256 " + common + " — 2 hosts: web-1, web-2 ---\nlisten 80;\n",
		"--- version 2 of 2: sha256 " + odd + " — 1 host: web-3 ---\nlisten 8080;\n",
		"--- failed, ",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("result lacks %q:\n%s", s, out)
		}
	}
}

// The 50 KB budget holds with 500 hosts printing 10 KB each (simulated
// agents: 500 real ones would need 500 inotify instances), tails shrink,
// and a host's saved full output is named in structuredContent.
func TestFanoutBudget500(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}, Quiet: true})
	hosts := make([]string, 500)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("sim-%03d", i)
	}
	line := strings.Repeat("y", 99) + "\n"
	fleet, err := simfleet.Start(context.Background(), simfleet.Config{
		// The default heartbeat (5 s), so that the offline bound (15 s)
		// holds while 500 hosts' announces wait behind the fan-out on a
		// loaded machine.
		URL: env.NATSURL(), Hosts: hosts, SigningKeys: env.Gateway.SigningKeys(),
		Credentials: env.SimCredentials(nil),
		Handler: func(host string, call *protocol.Call) *protocol.Result {
			out := host + " begins\n" + strings.Repeat(line, 101) + host + " ends\n"
			if strings.HasSuffix(host, "0") {
				out += "\n[Showing lines 1-2000 of 9000. Full output: /state/output/" + call.ID + ".log]"
			}
			return simfleet.BashResult(out, 0)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	for _, h := range hosts {
		env.WaitHost(h, true)
	}
	cs := env.Client("", nil)
	res := call(t, cs, "fleet_bash", map[string]any{"selector": "sim-*", "command": "print 10KB", "max_concurrency": 200})
	out := text(res)
	fr, by := fanoutOf(t, res)
	if len(out) > 50<<10 {
		t.Errorf("text is %d bytes, over 50 KB", len(out))
	}
	if fr.Counts["succeeded"] != 500 || res.IsError {
		t.Fatalf("counts %v", fr.Counts)
	}
	if !strings.Contains(out, "500 succeeded, 0 failed") || !strings.Contains(out, "sim-000 ends") || !strings.Contains(out, "[last ") {
		t.Errorf("result does not show cut tails:\n%.2000s", out)
	}
	if strings.Contains(out, "sim-000 begins") {
		t.Errorf("a 10 KB output was shown whole among 500")
	}
	if !strings.HasPrefix(by["sim-010"].FullOutput, "/state/output/c") || by["sim-011"].FullOutput != "" {
		t.Errorf("full output paths: sim-010 %q, sim-011 %q", by["sim-010"].FullOutput, by["sim-011"].FullOutput)
	}
	shown := slices.DeleteFunc(strings.Split(out, "\n"), func(l string) bool { return !strings.HasPrefix(l, "--- succeeded") })
	t.Logf("%d bytes; %d of 500 host groups shown; first header %q", len(out), len(shown), shown[0])
}
