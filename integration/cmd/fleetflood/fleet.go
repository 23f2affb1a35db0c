package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/integration/cmd/internal/childproc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fleet is the system under test: a fleet-gateway --dev process (its
// embedded NATS server on loopback TCP), the honest host's fleet-agent
// and the victim's, each joined with a join token of its own, and an MCP
// client session to the gateway.
type fleet struct {
	gw, honest, victim *childproc.Proc
	cs                 *mcp.ClientSession
	natsURL            string
	victimState        string
}

const (
	honestHost = "honest"
	victimHost = "victim"
)

func startFleet(ctx context.Context, bins map[string]string, dir string, stderr io.Writer) (*fleet, error) {
	var addrs [3]string
	for i := range addrs {
		a, err := childproc.FreeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	work := filepath.Join(dir, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	profile := "FLEET_PROFILE=" + filepath.Join(dir, "fleetctl.json")
	f := &fleet{natsURL: "nats://" + addrs[1]}
	var join, token string
	gwCmd := command(-1, bins["fleet-gateway"], "--dev", "--dev_join_token", "--listen", addrs[0], "--nats_listen", addrs[1], "--api_listen", addrs[2],
		"--data_dir", filepath.Join(dir, "gateway"), "--agent_name", "gateway-host", "--log_level", "warn")
	gwCmd.Dir = work
	// Its fleetctl profile stays with the command, not in the user's
	// configuration.
	gwCmd.Env = append(os.Environ(), profile)
	gw, err := childproc.Start(ctx, "fleet-gateway --dev", gwCmd, stderr, 2*time.Minute, func(line string) bool {
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
	// The victim's join token, from fleetctl.
	tc := exec.CommandContext(ctx, bins["fleetctl"], "token", "create", "--name", victimHost)
	tc.Env = append(os.Environ(), profile)
	out, err := tc.CombinedOutput()
	if err != nil {
		f.stop()
		return nil, fmt.Errorf("fleetctl token create: %w\n%s", err, out)
	}
	var victimToken string
	for _, l := range strings.Fields(string(out)) {
		if strings.HasPrefix(l, "fmcp1.") {
			victimToken = l
		}
	}
	if victimToken == "" {
		f.stop()
		return nil, fmt.Errorf("fleetctl token create printed no token:\n%s", out)
	}
	agent := func(name, tok string) (*childproc.Proc, error) {
		args := append([]string{"join"}, strings.Fields(join)...)
		args = append(args, "--name", name, "--state_dir", filepath.Join(dir, name), "--cwd", work, "--log_level", "warn")
		cmd := command(-1, bins["fleet-agent"], args...)
		p, err := childproc.Start(ctx, "fleet-agent "+name, cmd, stderr, 0, nil)
		if err != nil {
			return nil, err
		}
		if err := p.Send(tok); err != nil {
			p.Stop()
			return nil, err
		}
		return p, nil
	}
	if f.honest, err = agent(honestHost, token); err != nil {
		f.stop()
		return nil, err
	}
	if f.victim, err = agent(victimHost, victimToken); err != nil {
		f.stop()
		return nil, err
	}
	f.victimState = filepath.Join(dir, victimHost)
	if f.cs, err = connect(ctx, "http://"+addrs[0]+"/mcp"); err != nil {
		f.stop()
		return nil, err
	}
	if err := f.waitOnline(ctx, time.Minute); err != nil {
		f.stop()
		return nil, err
	}
	return f, nil
}

func connect(ctx context.Context, url string) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "fleetflood", Version: "1"}, nil)
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	return c.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			b.WriteString(t.Text)
		}
	}
	return b.String()
}

// waitOnline waits until the gateway lists both hosts online.
func (f *fleet) waitOnline(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		res, err := f.cs.CallTool(ctx, &mcp.CallToolParams{Name: "hosts", Arguments: map[string]any{}})
		if err == nil {
			t := resultText(res)
			if strings.Contains(t, honestHost+"\tonline") && strings.Contains(t, victimHost+"\tonline") {
				return nil
			}
		}
		for _, a := range []*childproc.Proc{f.honest, f.victim} {
			select {
			case <-a.Done():
				return fmt.Errorf("%s exited before it came online", a.Name())
			default:
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the hosts not online within %s (hosts: %v)", limit, err)
		}
	}
}

// bash runs command on host through the gateway and returns its output.
func (f *fleet) bash(ctx context.Context, host, command string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := f.cs.CallTool(cctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": host, "command": command}})
	if err != nil {
		return "", err
	}
	if res.IsError {
		return "", errors.New(resultText(res))
	}
	return resultText(res), nil
}

func (f *fleet) stop() {
	if f.cs != nil {
		_ = f.cs.Close()
	}
	// The agents first, so that their goodbyes reach the gateway.
	f.victim.Stop()
	f.honest.Stop()
	f.gw.Stop()
}
