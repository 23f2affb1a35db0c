package integration

import (
	"bufio"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/integration/enrolclient"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// GatewayProc is a fleet-gateway process, so that its memory can be
// measured apart from the test's client and agents.
type GatewayProc struct {
	t       testing.TB
	Cmd     *exec.Cmd
	MCPURL  string
	NATSURL string
	DataDir string
	APIAddr string // the fleet API's host:port
	token   string // the callers' bearer token; empty: authentication is off
	Done    chan struct{}

	joinOnce sync.Once
	join     string // a join token for the agents the test enrols
}

// StartGatewayProcess runs fleet-gateway with authentication off on
// loopback ports, with extra flags, and waits until it answers.
func StartGatewayProcess(t testing.TB, extra ...string) *GatewayProc {
	t.Helper()
	return LaunchGatewayProcess(t, "", extra...)
}

// LaunchGatewayProcess runs fleet-gateway on loopback ports with extra
// flags, and waits until it answers. With a token (which extra's
// --api_tokens must accept) callers authenticate with it; without one
// authentication is off.
func LaunchGatewayProcess(t testing.TB, token string, extra ...string) *GatewayProc {
	t.Helper()
	dir := t.TempDir()
	listen := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	natsListen := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	apiAddr := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	for i, a := range extra {
		if a == "--api_listen" && i+1 < len(extra) {
			apiAddr = extra[i+1]
		}
	}
	args := []string{"--listen", listen, "--nats_listen", natsListen, "--api_listen", apiAddr, "--data_dir", dir, "--log_level", "warn"}
	if token == "" {
		args = append(args, "--no_auth")
	}
	args = append(args, extra...)
	p := StartGatewayCommand(t, exec.Command(GatewayBinary(t), args...), listen, dir, token)
	p.NATSURL, p.APIAddr = "nats://"+natsListen, apiAddr
	return p
}

// StartGatewayCommand starts cmd, a fleet-gateway whose MCP endpoint and
// /healthz are on listen and whose data directory is dataDir, stops it
// with the test, and waits until it answers; with a token callers
// authenticate with it. A process that exits before it answers fails the
// test.
func StartGatewayCommand(t testing.TB, cmd *exec.Cmd, listen, dataDir, token string) *GatewayProc {
	t.Helper()
	if cmd.Stderr == nil {
		cmd.Stderr = testWriter{t}
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start gateway process: %v", err)
	}
	p := &GatewayProc{t: t, Cmd: cmd, MCPURL: "http://" + listen + "/mcp", DataDir: dataDir, token: token, Done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.Done) }()
	t.Cleanup(p.Stop)
	WaitFor(t, 30*time.Second, "gateway process to answer /healthz", func() bool {
		select {
		case <-p.Done:
			t.Fatalf("the gateway process exited before it answered: %v", cmd.ProcessState)
		default:
		}
		resp, err := http.Get("http://" + listen + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// Stop ends the process with an interrupt (it drains), or kills it after
// 20 s.
func (p *GatewayProc) Stop() {
	_ = p.Cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.Done:
	case <-time.After(20 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.Done
	}
}

// StartAgent runs an in-process agent called name against the gateway
// process and waits until it is online.
func (p *GatewayProc) StartAgent(name string, mod func(*agent.Config)) {
	p.t.Helper()
	dir := p.t.TempDir()
	creds, resp := p.Enrol(name)
	cfg := agent.Config{
		Servers: []string{p.NATSURL}, Name: name, Credentials: creds,
		GatewayKeys: resp.SigningKeys, GatewayKeySerial: resp.SigningKeySerial,
		Cwd: dir, StateDir: filepath.Join(dir, ".state"), Heartbeat: 500 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond, DrainTimeout: 5 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := agent.New(cfg)
	if err != nil {
		p.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	p.t.Cleanup(func() { cancel(); <-done })
	cs := p.Client()
	WaitFor(p.t, 20*time.Second, name+" online", func() bool {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "hosts", Arguments: map[string]any{"filter": name}})
		return err == nil && strings.Contains(Text(res), name+"\tonline")
	})
}

// Enrol enrols host with the gateway process over its fleet API, as a
// host does (a key made here, a join token the admin API made, the CA
// pinned), and returns its credential and the enrolment's answer.
func (p *GatewayProc) Enrol(host string) (agent.Credentials, *protocol.EnrolResponse) {
	p.t.Helper()
	url, pin := "https://"+p.APIAddr, GatewayCAPin(p.t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p.joinOnce.Do(func() {
		admin := enrolclient.New(url, pin, 1)
		admin.Token = p.token
		defer admin.Close()
		var tok protocol.TokenCreateResponse
		if err := admin.Post(ctx, protocol.AdminTokensPath, protocol.TokenCreateRequest{Uses: 100, TTL: "1h", Labels: map[string]string{"env": "test"}}, &tok); err != nil {
			p.t.Fatalf("create a join token: %v", err)
		}
		p.join = tok.Token
	})
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	c := enrolclient.New(url, pin, 1)
	defer c.Close()
	resp, err := c.Enrol(ctx, kp, p.join, host)
	if err != nil {
		p.t.Fatalf("enrol %s: %v", host, err)
	}
	return agent.Credentials{JWT: func() (string, error) { return resp.JWT, nil }, Seed: seed}, resp
}

func (p *GatewayProc) Client() *mcp.ClientSession {
	p.t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "fleet-test", Version: "1"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	transport := &mcp.StreamableClientTransport{Endpoint: p.MCPURL, DisableStandaloneSSE: true}
	if p.token != "" {
		transport.HTTPClient = BearerClient(p.token)
	}
	cs, err := c.Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		p.t.Fatalf("connect MCP client: %v", err)
	}
	p.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

// ResetPeak resets the process's peak RSS (VmHWM) to its current RSS.
func (p *GatewayProc) ResetPeak() {
	p.t.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.Cmd.Process.Pid), []byte("5"), 0); err != nil {
		p.t.Skipf("cannot reset the peak RSS of a process here: %v", err)
	}
}

// Memory returns the process's current and peak RSS.
func (p *GatewayProc) Memory() (rss, peak int64) {
	p.t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Cmd.Process.Pid))
	if err != nil {
		p.t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		for field, dst := range map[string]*int64{"VmRSS:": &rss, "VmHWM:": &peak} {
			if v, ok := strings.CutPrefix(sc.Text(), field); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				*dst = kb << 10
			}
		}
	}
	return rss, peak
}

// GatewayBinary builds cmd/fleet-gateway once per test binary.
func GatewayBinary(t testing.TB) string { return gatewayCommand.binary(t) }

const MiB = 1 << 20

// GatewayCAPin is the pin of the gateway process's fleet CA.
func GatewayCAPin(t testing.TB, gw *GatewayProc) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(gw.DataDir, "tls", "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("the fleet CA is not PEM")
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return protocol.CAPin(ca)
}
