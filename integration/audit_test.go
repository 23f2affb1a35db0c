package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// Every tool call, allowed or refused, leaves one record that an admin
// reads back from JetStream with the audit tool, and the same record in
// the audit file. Contents and secrets stay out of it.
func TestAuditTrail(t *testing.T) {
	f := newAuthFleet(t)
	ctx := context.Background()
	dev := f.ClientAs("2025-11-25", f.user("dev"))
	ops := f.ClientAs("", f.user("ops"))
	stranger := f.ClientAs("", f.user("stranger"))

	res, err := dev.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "alpha", "command": "echo hi"},
		Meta: mcp.Meta{"execution_id": "exec-42", "workspace_id": "ws-7"}})
	if err != nil || res.IsError {
		t.Fatalf("bash: %v %v", err, res)
	}
	mustErr(t, call(t, dev, "bash", map[string]any{"host": "alpha", "command": "export API_TOKEN=sekrit; exit 3"}), "Command exited with code 3")
	mustErr(t, call(t, dev, "bash", map[string]any{"host": "beta", "command": "uptime"}), "not permitted")
	mustErr(t, call(t, dev, "read", map[string]any{"host": "gamma", "path": "/etc/hostname"}), "unknown host")
	mustErr(t, call(t, dev, "audit", nil), "not permitted")
	mustOK(t, call(t, ops, "write", map[string]any{"host": "gamma", "path": "notes.txt", "content": "TOP-SECRET-CONTENT"}))
	mustErr(t, call(t, stranger, "hosts", nil), "not permitted")
	mustErr(t, call(t, f.ClientAs("", f.ciToken), "read", map[string]any{"host": "alpha", "path": "ci-missing.txt"}), "no such file")

	checkDevRecords(t, auditRecords(t, ops, map[string]any{"caller": "dev@example.com"}))
	checkAuditFilters(t, ops)
	checkNothingSecret(t, f, ops)
}

// checkDevRecords checks the records of dev's five calls.
func checkDevRecords(t *testing.T, recs []audit.Record) {
	t.Helper()

	if len(recs) != 5 {
		t.Fatalf("dev has %d records, want 5: %+v", len(recs), recs)
	}
	ok, failed, refused, hidden, notAdmin := recs[0], recs[1], recs[2], recs[3], recs[4]
	exit := func(r audit.Record) int {
		if r.ExitCode == nil {
			return -1
		}
		return *r.ExitCode
	}
	for _, c := range []struct {
		name string
		got  bool
		rec  audit.Record
	}{
		{"allowed bash", ok.Tool == "bash" && ok.Decision == "allowed" && ok.Rule == "staging-devs" && ok.Outcome == "ok" && exit(ok) == 0 &&
			ok.Args["command"] == "echo hi" && ok.Hosts[0] == "alpha" && ok.BytesOut == 3, ok},
		{"caller and metadata", ok.Caller.Subject == "user-dev" && ok.Caller.Email == "dev@example.com" && ok.Caller.ClientID == "claude-code" &&
			ok.Caller.Kind == string(access.KindOIDC) && ok.ProjectID == "proj-dev" && ok.ExecutionID == "exec-42" && ok.WorkspaceID == "ws-7" && ok.CallID != "", ok},
		{"failed command", failed.Outcome == "error" && exit(failed) == 3 && failed.Error == "Command exited with code 3" &&
			failed.Args["command"] == "export API_TOKEN=[redacted]; exit 3", failed},
		{"refused by a rule", refused.Decision == "denied" && refused.Rule == "no-bash-on-beta" && refused.Outcome == "refused" && refused.Hosts[0] == "beta", refused},
		{"hidden host", hidden.Decision == "denied" && strings.Contains(hidden.Reason, "not visible") && hidden.Hosts[0] == "gamma", hidden},
		{"admin tool", notAdmin.Tool == "audit" && notAdmin.Decision == "denied" && len(notAdmin.Hosts) == 0, notAdmin},
	} {
		if !c.got {
			t.Errorf("%s: unexpected record %+v", c.name, c.rec)
		}
		if c.rec.DurationMS < 0 || c.rec.Time.IsZero() {
			t.Errorf("%s: no time or duration: %+v", c.name, c.rec)
		}
	}

}

func checkAuditFilters(t *testing.T, ops *mcp.ClientSession) {
	t.Helper()
	for _, tc := range []struct {
		filters map[string]any
		want    int
	}{
		{map[string]any{"host": "beta"}, 1},
		{map[string]any{"decision": "denied", "caller": "dev"}, 3},
		{map[string]any{"tool": "write"}, 1},
		{map[string]any{"caller": "elsewhere.org"}, 1},
		{map[string]any{"caller": "ci"}, 1},
		{map[string]any{"since": "1h", "caller": "dev"}, 5},
		{map[string]any{"until": "1h"}, 0},
		{map[string]any{"since": time.Now().Add(time.Minute).Format(time.RFC3339)}, 0},
		{map[string]any{"caller": "dev", "limit": 2}, 2},
	} {
		if got := auditRecords(t, ops, tc.filters); len(got) != tc.want {
			t.Errorf("audit %v: %d records, want %d", tc.filters, len(got), tc.want)
		}
	}
	mustErr(t, call(t, ops, "audit", map[string]any{"since": "yesterday"}), `"yesterday" is neither an RFC 3339 time`)
}

// checkNothingSecret: contents and secrets stay out of the stream and the
// file, and the file has every record.
func checkNothingSecret(t *testing.T, f *authFleet, ops *mcp.ClientSession) {
	t.Helper()
	write := auditRecords(t, ops, map[string]any{"tool": "write"})[0]
	if write.Args["content_bytes"] != float64(len("TOP-SECRET-CONTENT")) || write.Args["content"] != nil {
		t.Errorf("write record args = %v, want the content's size only", write.Args)
	}
	all := auditRecords(t, ops, map[string]any{"limit": 500})
	data, _ := json.Marshal(all)
	fileData, err := os.ReadFile(f.auditLog)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{"TOP-SECRET-CONTENT", "sekrit", f.ciToken} {
		if strings.Contains(string(data), secret) || strings.Contains(string(fileData), secret) {
			t.Errorf("%q reached the audit trail", secret)
		}
	}
	// The file has every record the stream has (and the audit calls of
	// this test, which the stream has too by now).
	lines := 0
	for sc := bufio.NewScanner(strings.NewReader(string(fileData))); sc.Scan(); lines++ {
		var r audit.Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit file line %d: %v", lines+1, err)
		}
	}
	if lines < len(all) {
		t.Errorf("audit file has %d records, the stream %d", lines, len(all))
	}
}

// The audit stream is out of every agent's reach, and not even the
// gateway's own NATS user can delete or purge its records.
func TestAuditTrailCannotBeErased(t *testing.T) {
	env := NewEnv(t, Options{ExternalNATS: true})
	cs := env.Client("", nil)
	mustOK(t, call(t, cs, "hosts", nil))
	ctx := context.Background()

	gw := env.GatewayConn()
	js, _ := jetstream.New(gw)
	stream, err := js.Stream(ctx, protocol.AuditStream)
	if err != nil {
		t.Fatalf("audit stream: %v", err)
	}
	waitFor(t, 5*time.Second, "the hosts call's audit record", func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs > 0
	})
	if err := stream.DeleteMsg(ctx, 1); err == nil {
		t.Error("deleting an audit record succeeded")
	}
	if err := stream.Purge(ctx); err == nil {
		t.Error("purging the audit stream succeeded")
	}

	// Agents, each with its own identity: on an external cluster and on
	// the embedded server.
	embedded := NewEnv(t)
	for name, fleet := range map[string]*Env{"external host alpha": env, "embedded host alpha": embedded} {
		t.Run(name, func(t *testing.T) {
			errs := make(chan error, 8)
			nc, err := fleet.AgentConn("alpha", nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.Publish(protocol.AuditSubject(), []byte(`{"tool":"forged"}`))
			_ = nc.Flush()
			select {
			case err := <-errs:
				if !strings.Contains(strings.ToLower(err.Error()), "permission") {
					t.Errorf("publishing a forged record: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Error("publishing a forged audit record raised no permissions violation")
			}
			ajs, _ := jetstream.New(nc)
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			// A denied JetStream request gets no answer at all.
			if _, err := ajs.Stream(sctx, protocol.AuditStream); err == nil {
				t.Error("an agent reached the audit stream")
			}
		})
	}
}
