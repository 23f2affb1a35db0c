package integration

import (
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
	"github.com/fleetmcp/fleetmcp/integration/oidctest"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// callerPolicy is alpha's policy: the ci-deploy client may only read and
// patch under srv/app; group sre may do everything; nobody else anything.
const callerPolicy = `
callers:
  - name: deploy
    match: {client_id: [ci-deploy]}
    tools: {allow: [read, patch]}
    paths: {allow: ["srv/app/**"]}
  - name: sre
    match: {groups: [sre]}
`

// TestCallerHostPolicy: the gateway grants two callers every tool; the
// host's policy, deciding on the caller the signed envelope names, lets
// each do only its part, per tool and per path. Groups come from the
// configured claim only.
func TestCallerHostPolicy(t *testing.T) {
	is := oidctest.New(t, audience, "key-1")
	rules, err := access.ParseRules("access.yaml", []byte("rules:\n  - name: all\n    match: {sub: \"*\"}\n    hosts: [\"*\"]\n    tools: [\"*\"]\n    admin: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	var policyFile string
	env := NewEnv(t, Options{Agents: []string{},
		Gateway: func(c *gateway.Config) {
			c.AuthDisabled = false
			c.Auth = access.AuthConfig{Issuer: is.URL(), Audience: audience, KeyRefreshInterval: keyRefresh, GroupsClaim: "fleet_groups"}
			c.Access = rules
		}})
	env.StartAgent("alpha", func(c *agent.Config) {
		policyFile = filepath.Join(c.Cwd, "..", "alpha-policy.yaml")
		writeFile(t, policyFile, callerPolicy)
		c.PolicyFile = policyFile
		for _, f := range []string{"srv/app/main.txt", "srv/other/notes.txt"} {
			writeFile(t, filepath.Join(c.Cwd, f), "line one\nline two\n")
		}
	})
	env.WaitHost("alpha", true)
	client := func(sub string, extra map[string]any) *mcp.ClientSession {
		return env.ClientAs("", is.Token("key-1", is.Claims(sub, extra)))
	}
	deploy := client("svc-deploy", map[string]any{"client_id": "ci-deploy"})
	sre := client("alice", map[string]any{"fleet_groups": []string{"dev", "sre"}})
	// "groups" is not the configured claim: it makes nobody sre.
	pretender := client("mallory", map[string]any{"groups": []string{"sre"}})

	patch := func(file string) map[string]any {
		return map[string]any{"host": "alpha", "patch": "--- a/" + file + "\n+++ b/" + file + "\n@@ -1,2 +1,2 @@\n line one\n-line two\n+line 2\n"}
	}
	read := func(file string) map[string]any { return map[string]any{"host": "alpha", "path": file} }
	for _, tc := range []struct {
		who      *mcp.ClientSession
		name     string
		tool     string
		args     map[string]any
		ok       bool
		mentions string
	}{
		// Per tool.
		{deploy, "deploy", "read", read("srv/app/main.txt"), true, ""},
		{deploy, "deploy", "patch", patch("srv/app/main.txt"), true, ""},
		{deploy, "deploy", "bash", map[string]any{"host": "alpha", "command": "true"}, false, "not allowed for this caller on this host (callers.deploy: tools.allow lists only patch, read)"},
		{deploy, "deploy", "write", map[string]any{"host": "alpha", "path": "srv/app/new.txt", "content": "x"}, false, "not allowed for this caller on this host (callers.deploy: tools.allow lists only patch, read)"},
		{sre, "sre", "bash", map[string]any{"host": "alpha", "command": "echo hi"}, true, ""},
		{sre, "sre", "write", map[string]any{"host": "alpha", "path": "srv/other/new.txt", "content": "x"}, true, ""},
		// Per path.
		{deploy, "deploy", "read", read("srv/other/notes.txt"), false, "outside paths.allow"},
		{deploy, "deploy", "patch", patch("srv/other/notes.txt"), false, "callers.deploy"},
		{sre, "sre", "read", read("srv/other/notes.txt"), true, ""},
		{sre, "sre", "patch", patch("srv/other/notes.txt"), true, ""},
		// Anyone else: nothing.
		{pretender, "pretender", "read", read("srv/app/main.txt"), false, "matches no entry"},
		{pretender, "pretender", "bash", map[string]any{"host": "alpha", "command": "true"}, false, "mallory"},
	} {
		res := call(t, tc.who, tc.tool, tc.args)
		switch {
		case tc.ok && res.IsError:
			t.Errorf("%s %s %v: %s", tc.name, tc.tool, tc.args["path"], text(res))
		case !tc.ok && !res.IsError:
			t.Errorf("%s %s %v was allowed: %s", tc.name, tc.tool, tc.args["path"], text(res))
		case !tc.ok && !strings.Contains(text(res), tc.mentions):
			t.Errorf("%s %s: %q does not mention %q", tc.name, tc.tool, text(res), tc.mentions)
		}
	}
	// The refusals are the host's, as the audit trail records them.
	recs := auditRecords(t, sre, map[string]any{"caller": "svc-deploy", "decision": "denied"})
	if len(recs) != 4 || recs[0].Rule != "host policy" {
		t.Errorf("deploy's refused calls in the audit trail: %+v", recs)
	}
}

// TestSigningKeyRotationEndToEnd: a rotation made while the fleet runs
// (the files, then a reload) reaches a connected in-process agent and
// an agent process, which then run calls signed with the new key and
// store it; after the old key is retired, a call signed with it runs
// nowhere, and a restarted agent process still trusts only the new key.
func TestSigningKeyRotationEndToEnd(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true, Agents: []string{"alpha"}})
	env.StartAgentProcess("proc")
	env.WaitHost("proc", true)
	cs := env.Client("", nil)
	path := env.gwConfig.SigningKeyFile
	oldKey := gatewayKeyOf(t, path)
	oldID := protocol.NewEnvelopeSigner(oldKey).KeyID()
	trusted := func(host string) []string { h, _ := env.Gateway.Host(host); return h.TrustedKeys }
	if got := trusted("alpha"); !slices.Equal(got, []string{oldID}) {
		t.Fatalf("before the rotation alpha trusts %v", got)
	}
	wire, stopWire := capture(t, env.GatewayConn(), protocol.CallSubject("alpha"))
	defer stopWire()
	keyOf := func(m *nats.Msg) string {
		f, _ := protocol.DecodeFrame(protocol.Header(m.Header), m.Data)
		id, _, _ := strings.Cut(strings.TrimPrefix(f.Auth, "v1."), ".")
		return id
	}

	rep, err := signing.Rotate(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	newID := protocol.KeyIDs(rep.Keys)[0]
	if err := env.Gateway.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"alpha", "proc"} {
		waitFor(t, 20*time.Second, h+" to take the new key set in", func() bool { return slices.Contains(trusted(h), newID) })
	}
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo overlap"}))
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "proc", "command": "echo overlap"}))
	if id := keyOf(next(t, wire, "a call after the rotation")); id != newID {
		t.Errorf("after the rotation calls are signed with %s, want the new key %s", id, newID)
	}
	// The agent process stored the new keys in its enrolment.
	e, err := identity.Open(filepath.Join(env.AgentDir("proc"), ".state")).LoadEnrolment()
	if err != nil || e.SigningKeySerial != 1 || len(e.SigningKeys) != 2 {
		t.Errorf("proc's enrolment after the rotation: %+v, %v", e, err)
	}

	if _, err := signing.Retire(path, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := env.Gateway.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"alpha", "proc"} {
		waitFor(t, 20*time.Second, h+" to retire the old key", func() bool { return slices.Equal(trusted(h), []string{newID}) })
	}
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo new"}))

	// A call signed with the retired key (by whoever kept a copy) runs
	// nowhere.
	rogue := roguePublisher(t, env)
	marks := filepath.Join(env.AgentDir("alpha"), "retired")
	args, _ := json.Marshal(map[string]string{"host": "alpha", "command": "touch retired"})
	body, _ := json.Marshal(protocol.Call{ID: "old-key-1", Protocol: protocol.Version, Host: "alpha", Tool: "bash", TimeoutMS: 60000, Args: args})
	now := time.Now()
	alpha, _ := env.Gateway.Host("alpha")
	claims := protocol.Claims{Kind: protocol.MsgCall, Host: "alpha", Instance: alpha.Instance, CallID: "old-key-1", MsgID: protocol.NewMsgID(), Tool: "bash",
		Reply: "_INBOX.old", BodySHA256: sha256.Sum256(body), BodySize: int64(len(body)), TimeoutMS: 60000,
		IssuedAt: now, Expires: now.Add(protocol.EnvelopeLifetime)}
	h, data := protocol.Frame{Kind: protocol.KindCall, CallID: "old-key-1", Seq: 1, Part: 1, Parts: 1,
		Auth: protocol.NewEnvelopeSigner(oldKey).Sign(&claims), Data: body}.Encode()
	if err := rogue.PublishMsg(&nats.Msg{Subject: protocol.CallSubject("alpha"), Reply: "_INBOX.old", Header: nats.Header(h), Data: data}); err != nil {
		t.Fatal(err)
	}
	// No call of the gateway's: the refusal is in alpha's summary of
	// the messages it refused that no gateway call sent it.
	waitFor(t, 30*time.Second, "the retired key's call refused in the audit trail", func() bool {
		for _, r := range auditRecords(t, cs, map[string]any{"host": "alpha", "decision": "denied"}) {
			if reasons, _ := r.Args["reasons"].(map[string]any); r.Caller.Kind == string(access.KindHostReport) && reasons[string(protocol.RefusedUnknownKey)] != nil {
				return true
			}
		}
		return false
	})
	if _, err := os.Stat(marks); err == nil {
		t.Error("a call signed with the retired key ran")
	}

	// A restarted agent process trusts what it stored.
	env.StopAgent("proc")
	env.WaitHost("proc", false)
	env.RestartAgentProcess("proc")
	waitFor(t, 20*time.Second, "proc back, trusting the new key only", func() bool {
		h, ok := env.Gateway.Host("proc")
		return ok && h.Online && slices.Equal(h.TrustedKeys, []string{newID})
	})
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "proc", "command": "echo back"}))
}

// TestReceiptsInAudit: every result's receipt is checked and kept with
// its audit record, and the audit tool checks it again on demand; a
// host whose result carries an invalid receipt gets its result refused,
// flagged in the trail.
func TestReceiptsInAudit(t *testing.T) {
	env := NewEnv(t)
	cs := env.Client("", nil)
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "exit 4"}), "code 4")
	recs := auditRecords(t, cs, map[string]any{"host": "alpha", "tool": "bash", "verify": true})
	if len(recs) != 1 || recs[0].Receipt == nil {
		t.Fatalf("records %+v", recs)
	}
	rc := recs[0].Receipt
	if !rc.Verified || rc.Outcome != protocol.OutcomeToolError || rc.ExitCode == nil || *rc.ExitCode != 4 ||
		!strings.HasPrefix(rc.Recheck, "signature valid") || rc.CallID != recs[0].CallID {
		t.Errorf("receipt %+v", rc)
	}
	if line := text(call(t, cs, "audit", map[string]any{"host": "alpha", "tool": "bash"})); !strings.Contains(line, "receipt verified (tool_error exit 4") {
		t.Errorf("the audit tool's line: %s", line)
	}

	// A host that signs its receipts with another key than its own.
	other, _ := nkeys.CreateUser()
	startRogueHost(t, env, "liar", func(call *protocol.Call, f *rogueFrames) {
		f.resultSignedBy(&protocol.Result{Content: []protocol.Content{protocol.Text("all fine\n")}}, other)
	})
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "liar", "command": "true"}), "without a valid receipt")
	recs = auditRecords(t, cs, map[string]any{"host": "liar", "receipt": "problem"})
	if len(recs) != 1 || recs[0].Receipt.Verified || !strings.Contains(recs[0].Receipt.Problem, "not the host's enrolled key") {
		t.Errorf("the liar's record: %+v", recs)
	}
	if line := text(call(t, cs, "audit", map[string]any{"host": "liar"})); !strings.Contains(line, "receipt INVALID") {
		t.Errorf("the audit tool's line: %s", line)
	}
}

// TestHostWithoutKeys: a host enrolled before calls were signed (no
// gateway keys) is sent nothing: the caller gets a clear error; it runs
// nothing it is sent either.
func TestHostWithoutKeys(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	env.StartAgent("old", func(c *agent.Config) { c.GatewayKeys = nil })
	env.WaitHost("old", true)
	cs := env.Client("", nil)
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "old", "command": "true"}), "cannot check the gateway's signatures")
	if h, _ := env.Gateway.Host("old"); len(h.TrustedKeys) != 0 {
		t.Errorf("old announces trusted keys %v", h.TrustedKeys)
	}
}
