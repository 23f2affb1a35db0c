package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fleet is the system under test: a fleet-gateway --dev process (with its
// in-process agent, host devHost) and a separate fleet-agent process
// joined to it (host agentHost).
type fleet struct {
	gw, agent *childproc.Proc
	mcpURL    string
}

const (
	devHost   = "bench-dev"
	agentHost = "bench-agent"
)

func startFleet(ctx context.Context, gwBin, agBin, dir, cwd string, stderr io.Writer) (*fleet, error) {
	var addrs [3]string
	for i := range addrs {
		a, err := childproc.FreeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	f := &fleet{mcpURL: "http://" + addrs[0] + "/mcp"}
	var join, token string
	gwCmd := exec.Command(gwBin, "--dev", "--dev_join_token", "--listen", addrs[0], "--nats_listen", addrs[1], "--api_listen", addrs[2],
		"--data_dir", filepath.Join(dir, "gateway"), "--agent_name", devHost, "--log_level", "warn")
	// Its fleetctl profile stays with the bench, not in the user's
	// configuration.
	gwCmd.Env = append(os.Environ(), "FLEET_PROFILE="+filepath.Join(dir, "fleetctl.json"))
	gw, err := childproc.Start(ctx, "fleet-gateway --dev", gwCmd, stderr, 2*time.Minute,
		func(line string) bool {
			line = strings.TrimSpace(line)
			if s, ok := strings.CutPrefix(line, "token:"); ok {
				token = strings.TrimSpace(s)
			}
			if s, ok := strings.CutPrefix(line, "command: fleet-agent join "); ok {
				join = s
				return token != ""
			}
			return false
		})
	if err != nil {
		return nil, err
	}
	f.gw = gw
	args := append([]string{"join"}, strings.Fields(join)...)
	args = append(args, "--name", agentHost, "--state_dir", filepath.Join(dir, "agent"), "--cwd", cwd, "--log_level", "warn")
	// The agent prints nothing when it is up: readiness is the gateway
	// seeing it online, below.
	agCmd := exec.Command(agBin, args...)
	agCmd.Stdin = strings.NewReader(token + "\n")
	ag, err := childproc.Start(ctx, filepath.Base(agBin), agCmd, stderr, 0, nil)
	if err != nil {
		f.stop()
		return nil, err
	}
	f.agent = ag
	if err := f.waitOnline(ctx, 60*time.Second); err != nil {
		f.stop()
		return nil, err
	}
	return f, nil
}

// waitOnline waits until the gateway lists both hosts online.
func (f *fleet) waitOnline(ctx context.Context, limit time.Duration) error {
	cs, err := connect(ctx, f.mcpURL, era2025)
	if err != nil {
		return err
	}
	defer cs.Close()
	deadline := time.Now().Add(limit)
	for {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "hosts", Arguments: map[string]any{}})
		if err == nil {
			t := resultText(res)
			if strings.Contains(t, devHost+"\tonline") && strings.Contains(t, agentHost+"\tonline") {
				return nil
			}
		}
		select {
		case <-f.agent.Done():
			return errors.New("fleet-agent exited before it came online")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("both hosts not online within %s (hosts: %v)", limit, err)
		}
	}
}

func (f *fleet) stop() {
	// The agent first, so that its goodbye reaches the gateway.
	if f.agent != nil {
		f.agent.Stop()
	}
	f.gw.Stop()
}

// The floor: bare go-sdk streamable-HTTP servers, one of each protocol
// era, in a process of their own (this binary with -role floor).

type echoIn struct {
	Text string `json:"text"`
}

type blobIn struct {
	Size int `json:"size"`
}

type sinkIn struct {
	Data string `json:"data"`
}

// floorServer is the bare go-sdk server: echo returns its text; blob
// returns size bytes base64-encoded (what a read with binary_base64
// returns); sink takes data and returns its length (what a write
// returns, in size).
func floorServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "floor", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
	})
	blobs := map[int]string{}
	var blobMu = make(chan struct{}, 1)
	mcp.AddTool(s, &mcp.Tool{Name: "blob"}, func(_ context.Context, _ *mcp.CallToolRequest, in blobIn) (*mcp.CallToolResult, any, error) {
		if in.Size < 0 || in.Size > 64<<20 {
			return nil, nil, fmt.Errorf("size %d: want 0 to 64 MiB", in.Size)
		}
		blobMu <- struct{}{}
		b, ok := blobs[in.Size]
		if !ok {
			b = base64.StdEncoding.EncodeToString(payload(in.Size))
			blobs[in.Size] = b
		}
		<-blobMu
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%d bytes", in.Size)}, &mcp.TextContent{Text: b}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "sink"}, func(_ context.Context, _ *mcp.CallToolRequest, in sinkIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("%d bytes", len(in.Data))}}}, nil, nil
	})
	return s
}

// runFloor serves both eras on listen (/2025: sessions, /2026:
// stateless), with the relay tools over an embedded NATS server (the
// relay floor, relay.go), until ctx ends.
func runFloor(ctx context.Context, listen, keyFile string, stdout io.Writer) error {
	keys, err := readRelayKeys(keyFile)
	if err != nil {
		return err
	}
	ns, err := startRelayNATS()
	if err != nil {
		return err
	}
	defer ns.Shutdown()
	rc, err := newRelayClient(ns, keys)
	if err != nil {
		return err
	}
	defer rc.nc.Close()
	s := floorServer()
	addRelayTools(s, rc)
	mux := http.NewServeMux()
	mux.Handle("/2025", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{SessionTimeout: time.Hour, MaxRequestBodyBytes: 64 << 20}))
	mux.Handle("/2026", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true, MaxRequestBodyBytes: 64 << 20}))
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	return childproc.Serve(ctx, ln, mux, stdout, ns.ClientURL())
}

// floors are the floor server and the relay floor's responder.
type floors struct {
	server, relay *childproc.Proc
}

func (f *floors) stop() {
	f.relay.Stop()
	f.server.Stop()
}

// startFloor runs this binary as the floor server, with keys made in
// dir, and as the relay floor's responder, which reads files in work.
func startFloor(ctx context.Context, dir, work string, stderr io.Writer) (*floors, string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	addr, err := childproc.FreeAddr()
	if err != nil {
		return nil, "", err
	}
	keyFile := filepath.Join(dir, "relay-keys.json")
	if err := writeRelayKeys(keyFile); err != nil {
		return nil, "", err
	}
	var url, natsURL string
	server, err := childproc.Start(ctx, "floor server", exec.Command(exe, "-role", "floor", "-listen", addr, "-keys", keyFile), stderr, time.Minute, func(line string) bool {
		rest, ok := strings.CutPrefix(line, "READY ")
		url, natsURL, _ = strings.Cut(rest, " ")
		return ok
	})
	if err != nil {
		return nil, "", err
	}
	relay, err := childproc.Start(ctx, "relay responder", exec.Command(exe, "-role", "relay", "-nats", natsURL, "-keys", keyFile, "-dir", work), stderr, time.Minute, func(line string) bool {
		return line == "READY"
	})
	if err != nil {
		server.Stop()
		return nil, "", err
	}
	return &floors{server: server, relay: relay}, url, nil
}

// payload is n bytes of incompressible-looking data, the same every time.
func payload(n int) []byte {
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}
