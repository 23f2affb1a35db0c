package integration

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/access"
)

// logBuffer is a slog destination tests read while the gateway writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the lines logged so far that contain every one of want.
func (b *logBuffer) lines(want ...string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for _, l := range strings.Split(b.buf.String(), "\n") {
		ok := l != ""
		for _, w := range want {
			ok = ok && strings.Contains(l, w)
		}
		if ok {
			out = append(out, l)
		}
	}
	return out
}

// A reload puts new access rules, API tokens and their rate limits in
// force for the sessions already open, in both protocol eras; a broken
// file is refused with one log line naming it, and then neither file's
// new content is used. Calls keep running while the rules are swapped.
func TestReloadAccessAndTokens(t *testing.T) {
	dir := t.TempDir()
	accessFile, tokensFile := filepath.Join(dir, "access.yaml"), filepath.Join(dir, "tokens.yaml")
	ops, line, err := access.NewAPIToken("ops")
	if err != nil {
		t.Fatal(err)
	}
	tokensV1 := "tokens:\n  " + strings.Replace(line, "tools: [read]}", "tools: [read, bash]}", 1) + "\n"
	tokensV2 := "tokens:\n  " + strings.Replace(line, "tools: [read]}", `tools: [read, bash], rate_limit: "2/h"}`, 1) + "\n"
	accessV1 := "rules:\n  - {name: no-writes, deny: true, match: {sub: \"*\"}, hosts: [\"*\"], tools: [write]}\n"
	accessV2 := "rules:\n  - {name: no-bash, deny: true, match: {sub: \"*\"}, hosts: [\"*\"], tools: [bash]}\n"
	writeFile(t, accessFile, accessV1)
	writeFile(t, tokensFile, tokensV1)
	rules, err := access.LoadRules(accessFile)
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := access.LoadAPITokens(tokensFile)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) {
		c.AuthDisabled = false
		c.Auth = access.AuthConfig{APITokens: tokens}
		c.Access = rules
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}})
	sessions := map[string]*mcp.ClientSession{}
	for _, era := range eras {
		sessions[era.Name] = env.ClientAs(era.Version, ops)
	}
	bash := map[string]any{"host": "alpha", "command": "echo hi"}
	for name, cs := range sessions {
		if out := mustOK(t, call(t, cs, "bash", bash)); !strings.Contains(out, "hi") {
			t.Fatalf("%s: bash = %q", name, out)
		}
	}

	// Calls run throughout the reloads below (the race detector watches
	// the swaps).
	ctx, stop := context.WithCancel(context.Background())
	var busy sync.WaitGroup
	busyErrs := make(chan error, 1)
	busy.Go(func() {
		cs := env.ClientAs("2025-11-25", ops)
		for ctx.Err() == nil {
			_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read", Arguments: map[string]any{"host": "alpha", "path": "."}})
			if err != nil && ctx.Err() == nil {
				select {
				case busyErrs <- err:
				default:
				}
				return
			}
		}
	})
	defer func() { stop(); busy.Wait() }()

	writeFile(t, accessFile, accessV2)
	if err := env.Gateway.Reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	for _, cs := range sessions {
		mustErr(t, call(t, cs, "bash", bash), "bash not permitted for token ops")
	}

	// A broken access file: refused, named, the rules in force stay.
	writeFile(t, accessFile, "rules:\n  - {name: typo, deny: true, match: {sub: \"*\"}, hosts: [\"*\"], tols: [bash]}\n")
	err = env.Gateway.Reload()
	if err == nil || !strings.Contains(err.Error(), accessFile) {
		t.Fatalf("reload of a broken access file: err = %v, want one naming %s", err, accessFile)
	}
	if got := logs.lines("level=ERROR", "reload refused", accessFile); len(got) != 1 || !strings.Contains(got[0], "tols") {
		t.Fatalf("log lines about the refused file: %q; want one naming the file and the bad key", got)
	}
	for _, cs := range sessions {
		mustErr(t, call(t, cs, "bash", bash), "bash not permitted for token ops")
	}

	// A good access file with a broken tokens file: neither is put in
	// force.
	writeFile(t, accessFile, accessV1)
	writeFile(t, tokensFile, "tokens:\n  - {name: ops, sha256: nothex}\n")
	if err := env.Gateway.Reload(); err == nil || !strings.Contains(err.Error(), tokensFile) {
		t.Fatalf("reload of a broken tokens file: err = %v, want one naming %s", err, tokensFile)
	}
	if got := logs.lines("level=ERROR", "reload refused", tokensFile); len(got) != 1 {
		t.Fatalf("log lines about the refused tokens file: %q", got)
	}
	for _, cs := range sessions {
		mustErr(t, call(t, cs, "bash", bash), "bash not permitted for token ops")
	}

	// Both good: bash is back, under the token's new rate limit (which
	// counts every call of the caller: the busy calls end first).
	stop()
	busy.Wait()
	select {
	case err := <-busyErrs:
		t.Fatalf("a call during the reloads failed: %v", err)
	default:
	}
	writeFile(t, tokensFile, tokensV2)
	if err := env.Gateway.Reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	cs := sessions[eras[0].Name]
	for range 2 {
		mustOK(t, call(t, cs, "bash", bash))
	}
	mustErr(t, call(t, cs, "bash", bash), "rate limit reached: token ops may make 2 calls per hour")
}

// countLines returns the number of lines in the files.
func countLines(t testing.TB, files ...string) int {
	n := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		n += bytes.Count(data, []byte("\n"))
	}
	return n
}

// A reload reopens the audit file: after logrotate renames it, records
// of calls made after the reload land in a new file at the same path, and
// none made around the rename and the reload is lost.
func TestReloadReopensAuditFile(t *testing.T) {
	auditFile := filepath.Join(t.TempDir(), "audit.jsonl")
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) { c.Audit.File = auditFile }})
	cs := env.Client("2025-11-25", nil)
	const before = 5
	for range before {
		mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "true"}))
	}
	waitFor(t, 10*time.Second, "the first records in the audit file", func() bool { return countLines(t, auditFile) == before })
	const calls = before + 40
	var wg sync.WaitGroup
	for i := range calls - before {
		wg.Go(func() {
			mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "true"}))
		})
		if i == calls/4 {
			if err := os.Rename(auditFile, auditFile+".1"); err != nil {
				t.Fatal(err)
			}
			if err := env.Gateway.Reload(); err != nil {
				t.Fatalf("reload: %v", err)
			}
		}
	}
	wg.Wait()
	waitFor(t, 10*time.Second, "every record in the old or the new audit file", func() bool {
		return countLines(t, auditFile, auditFile+".1") == calls
	})
	mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo after-rotation"}))
	waitFor(t, 10*time.Second, "the record after the reload in the new file", func() bool {
		data, _ := os.ReadFile(auditFile)
		return strings.Contains(string(data), "after-rotation")
	})
	if old, _ := os.ReadFile(auditFile + ".1"); strings.Contains(string(old), "after-rotation") {
		t.Fatal("a record made after the reload went to the renamed file")
	}
	if n := countLines(t, auditFile+".1"); n < before {
		t.Fatalf("the renamed file holds %d records, want at least the %d made before the rename", n, before)
	}
	if n := countLines(t, auditFile, auditFile+".1"); n != calls+1 {
		t.Fatalf("%d records in the two files, want %d", n, calls+1)
	}
}

// fleet-gateway survives SIGHUP, and reopens its audit file on it.
func TestGatewayProcessReloadsOnHangup(t *testing.T) {
	auditFile := filepath.Join(t.TempDir(), "audit.jsonl")
	p := startGatewayProcess(t, "--audit_file", auditFile)
	cs := p.Client()
	calls := 0
	hosts := func() {
		t.Helper()
		mustOK(t, call(t, cs, "hosts", nil))
		calls++
	}
	hosts()
	waitFor(t, 10*time.Second, "the first record in the audit file", func() bool { return countLines(t, auditFile) == 1 })
	if err := os.Rename(auditFile, auditFile+".1"); err != nil {
		t.Fatal(err)
	}
	if err := p.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The reload happens when the process gets to the signal: call until
	// a record lands in the new file.
	waitFor(t, 20*time.Second, "a record in the reopened audit file", func() bool {
		select {
		case <-p.Done:
			t.Fatal("fleet-gateway exited on SIGHUP")
		default:
		}
		hosts()
		return countLines(t, auditFile) > 0
	})
	for range 3 {
		if err := p.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		hosts()
	}
	waitFor(t, 10*time.Second, "every record in one of the files", func() bool {
		return countLines(t, auditFile, auditFile+".1") == calls
	})
	select {
	case <-p.Done:
		t.Fatal("fleet-gateway exited on SIGHUP")
	default:
	}
}

// fleet-agent reloads its host policy on SIGHUP: a session opened before
// sees the new policy at once (tools and paths), the new digest is
// announced, and a broken file is refused with one log line naming it
// while the policy in force stays.
func TestAgentProcessReloadsPolicyOnHangup(t *testing.T) {
	env := NewEnv(t, Options{Agents: []string{}})
	dir := t.TempDir()
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, policyFile, "tools: {deny: [write]}\n")
	writeFile(t, filepath.Join(dir, "secret", "key.txt"), "key\n")
	logs := &logBuffer{}
	cmd := env.AgentCommand("beta", dir, "--policy", policyFile)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	env.WaitHost("beta", true)
	h, _ := env.Gateway.Host("beta")
	first := h.PolicyDigest
	cs := env.Client("2025-11-25", nil)
	mustErr(t, call(t, cs, "write", map[string]any{"host": "beta", "path": "x.txt", "content": "x"}), "tool write is not served")
	mustOK(t, call(t, cs, "read", map[string]any{"host": "beta", "path": "secret/key.txt"}))

	hangup := func() {
		t.Helper()
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, policyFile, "tools: {deny: [bash]}\npaths: {deny: [\"**/secret/**\"]}\n")
	hangup()
	var second string
	waitFor(t, 20*time.Second, "the new policy digest announced", func() bool {
		h, _ := env.Gateway.Host("beta")
		second = h.PolicyDigest
		return second != first && h.Online
	})
	mustOK(t, call(t, cs, "write", map[string]any{"host": "beta", "path": "x.txt", "content": "x"}))
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "beta", "command": "true"}), "tool bash is not served")
	mustErr(t, call(t, cs, "read", map[string]any{"host": "beta", "path": "secret/key.txt"}), "denied")

	writeFile(t, policyFile, "tools: {deny: [bash]}\npathz: {}\n")
	hangup()
	waitFor(t, 20*time.Second, "the refusal of the broken policy logged", func() bool {
		return len(logs.lines("level=ERROR", "reload refused", policyFile)) > 0
	})
	if got := logs.lines("reload refused"); len(got) != 1 || !strings.Contains(got[0], "pathz") {
		t.Fatalf("log lines about the refused policy: %q; want one naming the file and the bad key", got)
	}
	select {
	case <-done:
		t.Fatal("fleet-agent exited on SIGHUP")
	default:
	}
	if h, _ := env.Gateway.Host("beta"); h.PolicyDigest != second || !h.Online {
		t.Fatalf("after a refused reload: digest %s online %v, want %s online", h.PolicyDigest, h.Online, second)
	}
	mustErr(t, call(t, cs, "bash", map[string]any{"host": "beta", "command": "true"}), "tool bash is not served")
	mustOK(t, call(t, cs, "write", map[string]any{"host": "beta", "path": "y.txt", "content": "y"}))
}

// fleet-gateway drains on SIGTERM: a call in flight finishes and is
// audited, then the process exits cleanly.
func TestGatewayProcessDrainsOnSIGTERM(t *testing.T) {
	auditFile := filepath.Join(t.TempDir(), "audit.jsonl")
	p := startGatewayProcess(t, "--audit_file", auditFile)
	p.StartAgent("alpha", nil)
	cs := p.Client()
	started := filepath.Join(t.TempDir(), "started")
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "alpha", "command": "touch " + started + "; sleep 1; echo finished"}})
		if err != nil {
			t.Errorf("call in flight at SIGTERM: %v", err)
		}
		done <- res
	}()
	waitFor(t, 20*time.Second, "the command to start", func() bool {
		_, err := os.Stat(started)
		return err == nil
	})
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res == nil || !strings.Contains(text(res), "finished") {
		t.Fatalf("call in flight at SIGTERM: %+v", res)
	}
	select {
	case <-p.Done:
	case <-time.After(20 * time.Second):
		t.Fatal("fleet-gateway did not exit after SIGTERM")
	}
	if code := p.Cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d", code)
	}
	if data, _ := os.ReadFile(auditFile); !strings.Contains(string(data), `"tool":"bash"`) {
		t.Errorf("no audit record of the drained call in %q", data)
	}
}
