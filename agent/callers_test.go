//go:build unix

package agent

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// TestAgentCallerIssuers: an entry written for the API token deploy
// (sub token:deploy, without iss, as entries were written before they
// said their issuer) is the API token's only; an identity provider's
// user whose subject is spelt the same is another caller, to the policy
// and in the records of the tasks it starts.
func TestAgentCallerIssuers(t *testing.T) {
	const host = "iss-1"
	ns := startTestNATS(t)
	nc := connectTest(t, ns)
	cwd := t.TempDir()
	if err := os.WriteFile(filepath.Join(cwd, "secret.txt"), []byte("deploy key"), 0o644); err != nil {
		t.Fatal(err)
	}
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(`
callers:
  - name: deploy
    match: {sub: ["token:deploy"]}
    tools: {allow: [read, bash]}
  - name: idp
    match: {iss: ["https://login.example.com"], sub: ["*"]}
    tools: {allow: [bash]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	pres := presence(t, nc)
	runAgent(t, ns, Config{Name: host, Cwd: cwd, PolicyFile: policyFile})
	nextAnnounce(t, pres, host, false)
	token := protocol.Caller{Issuer: protocol.IssuerAPIToken, Subject: "token:deploy"}
	n := 0
	call := func(caller protocol.Caller, tool string, args any) *protocol.Result {
		n++
		c := newCall(host, "ci-"+string(rune('a'+n)), tool, args)
		c.Caller = caller
		res, _ := sendCall(t, nc, c).result(t, c.ID)
		return res
	}
	read := map[string]string{"path": "secret.txt"}
	if res := call(token, "read", read); res.Error != nil || res.IsError {
		t.Fatalf("the API token deploy reads: %+v", res)
	}
	for _, sub := range []string{"token:deploy", "deploy", "Token:deploy", "t\u043eken:deploy"} {
		user := protocol.Caller{Issuer: "https://login.example.com", Subject: sub}
		wantCode(t, call(user, "read", read), protocol.CodeDenied, "callers.idp: tools.allow lists only bash")
	}
	// An issuer the policy does not name gets no entry at all.
	stranger := protocol.Caller{Issuer: "https://other.example.org", Subject: "token:deploy"}
	wantCode(t, call(stranger, "read", read), protocol.CodeDenied, "token:deploy of https://other.example.org", "matches no entry")

	// Tasks record who started them, issuer included.
	for _, tc := range []struct {
		caller protocol.Caller
		want   string
	}{
		{token, "token:deploy"},
		{protocol.Caller{Issuer: "https://login.example.com", Subject: "token:deploy"}, "token:deploy of https://login.example.com"},
	} {
		res := call(tc.caller, "bash", map[string]any{"command": "true", "background": true})
		if res.Error != nil || res.IsError {
			t.Fatalf("%s starts a task: %+v", tc.want, res)
		}
		var v taskView
		if err := json.Unmarshal(res.Structured, &v); err != nil || v.Caller != tc.want {
			t.Errorf("task started by %+v records caller %q (%v), want %q", tc.caller, v.Caller, err, tc.want)
		}
		// Wait for the task to end: it outlives the agent, not the test.
		for deadline := time.Now().Add(time.Minute); !v.State.Ended(); {
			if time.Now().After(deadline) {
				t.Fatalf("task %s has not ended within a minute", v.TaskID)
			}
			res := call(tc.caller, "task_status", map[string]any{"task_id": v.TaskID, "wait": 10})
			if res.Error != nil || res.IsError {
				t.Fatalf("task_status %s: %+v", v.TaskID, res)
			}
			if err := json.Unmarshal(res.Structured, &v); err != nil {
				t.Fatal(err)
			}
		}
	}
}
