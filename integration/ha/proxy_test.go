//go:build linux

package ha

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway/access"
	"github.com/fleetmcp/fleetmcp/integration/hacheck"

	"github.com/fleetmcp/fleetmcp/integration"
)

// The reverse-proxy examples of deploy/proxy, run as they are (only the
// addresses and certificate paths changed) in front of a gateway process
// with authentication on, and driven by the MCP client through them.

// TestProxyNginx: deploy/proxy/nginx.conf streams answers, passes the
// session and the Host the gateway builds its metadata from, and refuses
// foreign origins.
func TestProxyNginx(t *testing.T) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		t.Skip("no nginx here (.ci/install-test-tools installs it)")
	}
	gw, token := startAuthGateway(t)
	tlsDir := integration.LoopbackTLS(t, t.TempDir())
	port := integration.FreePort(t)
	dir := t.TempDir()
	site := examineExample(t, "nginx.conf", map[string]string{
		"server 127.0.0.1:8080;":                   "server " + strings.TrimPrefix(strings.TrimSuffix(gw.MCPURL, "/mcp"), "http://") + ";",
		"listen 443 ssl;":                          fmt.Sprintf("listen 127.0.0.1:%d ssl;", port),
		"/etc/ssl/fleet.example.com/fullchain.pem": filepath.Join(tlsDir, "server.pem"),
		"/etc/ssl/fleet.example.com/privkey.pem":   filepath.Join(tlsDir, "server-key.pem"),
	})
	integration.WriteFile(t, filepath.Join(dir, "fleetmcp.conf"), site)
	for _, sub := range []string{"body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	// One process, which dies with the test binary (see startProxy).
	main := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log stderr warn;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/fleetmcp.conf;
}
`, dir)
	integration.WriteFile(t, filepath.Join(dir, "nginx.conf"), main)
	startProxy(t, exec.Command(bin, "-e", "stderr", "-p", dir, "-c", filepath.Join(dir, "nginx.conf")))
	checkProxy(t, gw, token, fmt.Sprintf("https://127.0.0.1:%d", port), filepath.Join(tlsDir, "ca.pem"))
}

// TestProxyCaddy: the same for deploy/proxy/Caddyfile.
func TestProxyCaddy(t *testing.T) {
	bin, err := exec.LookPath("caddy")
	if err != nil {
		t.Skip("no caddy here (.ci/install-test-tools installs it)")
	}
	gw, token := startAuthGateway(t)
	tlsDir := integration.LoopbackTLS(t, t.TempDir())
	port := integration.FreePort(t)
	dir := t.TempDir()
	upstream := strings.TrimPrefix(strings.TrimSuffix(gw.MCPURL, "/mcp"), "http://")
	site := examineExample(t, "Caddyfile", map[string]string{
		"fleet.example.com {": fmt.Sprintf("https://127.0.0.1:%d {\n\ttls %s %s", port, filepath.Join(tlsDir, "server.pem"), filepath.Join(tlsDir, "server-key.pem")),
	})
	if n := strings.Count(site, "reverse_proxy 127.0.0.1:8080"); n != 3 {
		t.Fatalf("the Caddyfile proxies to 127.0.0.1:8080 %d times; the test expects 3", n)
	}
	site = strings.ReplaceAll(site, "reverse_proxy 127.0.0.1:8080", "reverse_proxy "+upstream)
	// Global options: no admin endpoint, no ACME, state in the test.
	site = fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tstorage file_system %s\n}\n\n", filepath.Join(dir, "data")) + site
	conf := filepath.Join(dir, "Caddyfile")
	integration.WriteFile(t, conf, site)
	cmd := exec.Command(bin, "run", "--adapter", "caddyfile", "--config", conf)
	cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+filepath.Join(dir, "data"), "XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	startProxy(t, cmd)
	checkProxy(t, gw, token, fmt.Sprintf("https://127.0.0.1:%d", port), filepath.Join(tlsDir, "ca.pem"))
}

// examineExample reads deploy/proxy/name and makes the replacements, each
// of which must match exactly once (so the test notices when the example
// changes shape).
func examineExample(t *testing.T, name string, replace map[string]string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(integration.ModuleRoot(t), "deploy", "proxy", name))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	for old, repl := range replace {
		if n := strings.Count(s, old); n != 1 {
			t.Fatalf("deploy/proxy/%s has %q %d times; the test expects it once", name, old, n)
		}
		s = strings.Replace(s, old, repl, 1)
	}
	return s
}

// startAuthGateway runs a gateway process whose callers authenticate
// with an API token that may use every tool (and the admin API, where
// the agent "behind" is enrolled).
func startAuthGateway(t *testing.T) (*integration.GatewayProc, string) {
	t.Helper()
	token, line, err := access.NewAPIToken("proxy-test")
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "api-tokens.yaml")
	integration.WriteFile(t, file, "tokens:\n  "+strings.Replace(line, "tools: [read]", `tools: ["*"], admin: true`, 1)+"\n")
	gw := integration.LaunchGatewayProcess(t, token, "--api_tokens", file)
	gw.StartAgent("behind", nil)
	return gw, token
}

// startProxy runs the proxy and stops it with the test, or with the test
// binary should that die first (a timeout's panic runs no cleanup).
func startProxy(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Stdout, cmd.Stderr = integration.TestLog(t), integration.TestLog(t)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := integration.WaitProcess(cmd)
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Errorf("%s did not stop within 20s of SIGTERM", cmd.Path)
			_ = cmd.Process.Kill()
			<-done
		}
	})
	go func() {
		<-done
		if cmd.ProcessState != nil && !cmd.ProcessState.Success() && cmd.ProcessState.ExitCode() > 0 {
			t.Logf("%s exited: %v", cmd.Path, cmd.ProcessState)
		}
	}()
}

// checkProxy drives the gateway through the proxy at base (https, its
// certificate from the CA in caFile).
func checkProxy(t *testing.T, gw *integration.GatewayProc, token, base, caFile string) {
	t.Helper()
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	// A proxy that buffers holds the headers of a stream back: fail, do
	// not hang, when none come.
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ResponseHeaderTimeout: 10 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	plain := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	integration.WaitFor(t, 30*time.Second, "the proxy to answer /healthz", func() bool {
		resp, err := plain.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	t.Run("metadata from Host and X-Forwarded-Proto", func(t *testing.T) {
		resp := post(t, plain, base+"/mcp", "")
		want := `resource_metadata="` + base + `/.well-known/oauth-protected-resource/mcp"`
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), want) {
			t.Errorf("without a token: %s, WWW-Authenticate %q; want 401 naming %s", resp.Status, resp.Header.Get("WWW-Authenticate"), want)
		}
		r, err := plain.Get(base + "/.well-known/oauth-protected-resource/mcp")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var meta struct{ Resource string }
		if err := json.NewDecoder(r.Body).Decode(&meta); err != nil || meta.Resource != base+"/mcp" {
			t.Errorf("the metadata names resource %q (%v); want %s/mcp", meta.Resource, err, base)
		}
	})

	t.Run("foreign origin refused", func(t *testing.T) {
		if resp := post(t, plain, base+"/mcp", "https://evil.example"); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a request from https://evil.example: %s; want 403", resp.Status)
		}
		if resp := post(t, plain, base+"/mcp", "https://fleet.example.com"); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("a request from the endpoint's own origin: %s; want it to reach the gateway (401 without a token)", resp.Status)
		}
	})

	t.Run("sessions and streaming", func(t *testing.T) {
		var pl integration.ProgressLog
		c := mcp.NewClient(&mcp.Implementation{Name: "fleet-proxy-test", Version: "1"}, &mcp.ClientOptions{ProgressNotificationHandler: pl.Handler})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		hc := &http.Client{Transport: integration.BearerTransport(token, tr)}
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
		if err != nil {
			t.Fatalf("connect through the proxy: %v", err)
		}
		defer cs.Close()
		if cs.ID() == "" {
			t.Error("no Mcp-Session-Id came back through the proxy")
		}
		if out := integration.MustOK(t, integration.Call(t, cs, "hosts", map[string]any{"filter": "behind"})); !strings.Contains(out, "behind\tonline") {
			t.Fatalf("hosts through the proxy:\n%s", out)
		}
		// Output printed over 2 s must arrive as it is printed, not
		// when the call ends.
		params := &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "behind",
			"command": "for i in 1 2 3 4 5; do echo tick$i; sleep 0.5; done"}}
		params.SetProgressToken("ticks")
		res, err := cs.CallTool(ctx, params)
		ended := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		integration.MustOK(t, res)
		at := pl.Times()
		if len(at) == 0 {
			t.Fatal("no progress came through the proxy")
		}
		if early := ended.Sub(at[0]); early < time.Second {
			t.Errorf("the first output arrived %s before the result; want it as printed (about 2 s before): the proxy buffers", early.Round(time.Millisecond))
		}
		t.Logf("%d progress notifications; the first %s before the result", len(at), ended.Sub(at[0]).Round(time.Millisecond))
	})
}

// post sends an MCP initialize to url, with origin when not empty, and
// returns the answer (its body read and closed).
func post(t *testing.T, c *http.Client, url, origin string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// TestProxyNginxReplicas: deploy/proxy/nginx-replicas.conf in front of
// two gateways of a cluster sends every request of a 2025 session to the
// gateway that made it, spreads 2026 requests over both, and, once the
// session's gateway is down, hands the session's next request to the
// other, which answers 404: the go-sdk client reports the session gone
// (mcp.ErrSessionMissing) and a new session through the proxy goes on;
// the 2026 client goes on without noticing.
func TestProxyNginxReplicas(t *testing.T) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		t.Skip("no nginx here (.ci/install-test-tools installs it)")
	}
	c := startGatewayCluster(t, 3, nil)
	hosts := []string{"lb-1", "lb-2"}
	c.simFleet(hosts, nil)
	for i := range 2 {
		waitOnline(t, c.gw(i), hosts)
	}
	tlsDir := integration.LoopbackTLS(t, t.TempDir())
	port := integration.FreePort(t)
	dir := t.TempDir()
	site := examineExample(t, "nginx-replicas.conf", map[string]string{
		"    server 127.0.0.1:8080;              # gw1: fleet-gateway --name gw1 --listen ...": "    server " + c.cfgs[0].Listen + ";",
		"    server 127.0.0.1:8081;              # gw2":                                        "    server " + c.cfgs[1].Listen + ";",
		"    server 127.0.0.1:8080;\n    server 127.0.0.1:8081 backup;":                        "    server " + c.cfgs[0].Listen + ";\n    server " + c.cfgs[1].Listen + " backup;",
		"    server 127.0.0.1:8081;\n    server 127.0.0.1:8080 backup;":                        "    server " + c.cfgs[1].Listen + ";\n    server " + c.cfgs[0].Listen + " backup;",
		"listen 443 ssl;":                          fmt.Sprintf("listen 127.0.0.1:%d ssl;", port),
		"/etc/ssl/fleet.example.com/fullchain.pem": filepath.Join(tlsDir, "server.pem"),
		"/etc/ssl/fleet.example.com/privkey.pem":   filepath.Join(tlsDir, "server-key.pem"),
	})
	if strings.Contains(site, "127.0.0.1:808") {
		t.Fatal("deploy/proxy/nginx-replicas.conf names a gateway address the test did not replace")
	}
	integration.WriteFile(t, filepath.Join(dir, "fleetmcp.conf"), site)
	startNginx(t, bin, dir)
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	hc := proxyClient(t, filepath.Join(tlsDir, "ca.pem"))
	integration.WaitFor(t, 30*time.Second, "the proxy to answer /healthz", func() bool {
		resp, err := hc.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	connect := func(version string) *mcp.ClientSession {
		t.Helper()
		cl := mcp.NewClient(&mcp.Implementation{Name: "fleet-lb-test", Version: "1"}, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc, DisableStandaloneSSE: true},
			&mcp.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			t.Fatalf("connect (%q) through the proxy: %v", version, err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		return cs
	}
	old := connect("2025-11-25")
	owner := strings.SplitN(old.ID(), ".", 2)[0]
	if owner != "gw1" && owner != "gw2" {
		t.Fatalf("session ID %q names no gateway behind the proxy", old.ID())
	}
	stateless := connect("")
	served := map[string]map[string]int{}
	for i := range 12 {
		for _, cs := range []*mcp.ClientSession{old, stateless} {
			tag := fmt.Sprintf("lb-%d-%p", i, cs)
			integration.MustOK(t, callMeta(t, cs, hosts[i%2], tag))
			era := "2026"
			if cs == old {
				era = "2025"
			}
			if served[era] == nil {
				served[era] = map[string]int{}
			}
			served[era][gatewayOf(t, c, tag)]++
		}
	}
	t.Logf("calls per gateway: 2025 session %v, 2026 %v", served["2025"], served["2026"])
	if len(served["2025"]) != 1 || served["2025"][owner] != 12 {
		t.Errorf("the 2025 session's calls went to %v; want all 12 to %s, which holds the session", served["2025"], owner)
	}
	if len(served["2026"]) != 2 {
		t.Errorf("the stateless calls went to %v; want both gateways", served["2026"])
	}

	// The session's gateway goes down.
	down := 0
	if owner == "gw2" {
		down = 1
	}
	c.stop(down)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = old.CallTool(ctx, &mcp.CallToolParams{Name: "hosts"})
	if !errors.Is(err, mcp.ErrSessionMissing) {
		t.Fatalf("a call of the session of the stopped gateway: %v; want the session reported gone (404, mcp.ErrSessionMissing)", err)
	}
	t.Logf("the session of the stopped gateway: %v", err)
	fresh := connect("2025-11-25")
	if !strings.HasPrefix(fresh.ID(), c.cfgs[1-down].Name+".") {
		t.Errorf("the new session %q is not on the gateway left, %s", fresh.ID(), c.cfgs[1-down].Name)
	}
	for i := range 4 {
		integration.MustOK(t, integration.Call(t, fresh, "bash", map[string]any{"host": hosts[i%2], "command": "echo again"}))
		integration.MustOK(t, integration.Call(t, stateless, "bash", map[string]any{"host": hosts[i%2], "command": "echo on"}))
	}
}

// startNginx runs nginx with dir's fleetmcp.conf as its one site.
func startNginx(t *testing.T, bin, dir string) {
	t.Helper()
	for _, sub := range []string{"body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	main := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log stderr error;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    include %[1]s/fleetmcp.conf;
}
`, dir)
	integration.WriteFile(t, filepath.Join(dir, "nginx.conf"), main)
	startProxy(t, exec.Command(bin, "-e", "stderr", "-p", dir, "-c", filepath.Join(dir, "nginx.conf")))
}

// proxyClient is an HTTP client that trusts the CA in caFile.
func proxyClient(t *testing.T, caFile string) *http.Client {
	t.Helper()
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ResponseHeaderTimeout: 30 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// callMeta runs "echo tag" on host with tag as the call's execution_id.
func callMeta(t testing.TB, cs *mcp.ClientSession, host, tag string) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": host, "command": "echo " + tag},
		Meta: mcp.Meta{"execution_id": tag}})
	if err != nil {
		t.Fatalf("bash on %s: %v", host, err)
	}
	return res
}

// gatewayOf returns the gateway the audit record of the call tagged tag
// names (its record is stored before the call is answered).
func gatewayOf(t testing.TB, c *gwCluster, tag string) string {
	t.Helper()
	nc := c.conn(2)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	recs, err := hacheck.ReadRecords(ctx, nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.ExecutionID == tag {
			return r.Gateway
		}
	}
	t.Fatalf("no audit record of call %s", tag)
	return ""
}
