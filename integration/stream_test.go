//go:build unix

package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway"
)

func TestBashStreamsProgress(t *testing.T) {
	env := NewEnv(t, Options{Gateway: func(c *gateway.Config) { c.ProgressIdle = 700 * time.Millisecond }})
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			var pl progressLog
			cs := env.Client(era.Version, &mcp.ClientOptions{ProgressNotificationHandler: pl.Handler})
			params := &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{
				"host": "alpha", "command": "echo first; sleep 1.5; echo second; sleep 2.5; echo third",
			}}
			params.SetProgressToken("tok-" + era.Name)
			done := make(chan *mcp.CallToolResult, 1)
			go func() {
				res, err := cs.CallTool(context.Background(), params)
				if err != nil {
					t.Errorf("bash: %v", err)
				}
				done <- res
			}()
			// The first line must arrive while the command still runs.
			waitFor(t, 1400*time.Millisecond, "first output line as progress", func() bool { return strings.Contains(pl.Joined(), "first") })
			before := pl.Count()
			res := <-done
			if got := mustOK(t, res); got != "first\nsecond\nthird\n" {
				t.Fatalf("result = %q", got)
			}
			if !strings.Contains(pl.Joined(), "second") {
				t.Fatalf("second line never streamed: %q", pl.Joined())
			}
			// During the silent 2.5 s, keepalives still produce notifications.
			if pl.Count()-before < 2 {
				t.Fatalf("only %d notifications after the first line; silent periods must still notify", pl.Count()-before)
			}
		})
	}
}

func TestCancelKillsProcessGroup(t *testing.T) {
	env := NewEnv(t)
	for _, era := range eras {
		t.Run(era.Name, func(t *testing.T) {
			cs := env.Client(era.Version, nil)
			pidFile := filepath.Join(env.AgentDir("alpha"), "pids-"+era.Name)
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{
					"host": "alpha", "command": fmt.Sprintf("sleep 60 & echo $$ $! > %s; wait", pidFile),
				}})
				errc <- err
			}()
			var pids []int
			waitFor(t, 5*time.Second, "pid file", func() bool {
				data, err := os.ReadFile(pidFile)
				f := strings.Fields(string(data))
				if err != nil || len(f) != 2 {
					return false
				}
				for _, s := range f {
					n, _ := strconv.Atoi(s)
					pids = append(pids, n)
				}
				return true
			})
			cancel()
			start := time.Now()
			<-errc
			waitFor(t, 1500*time.Millisecond, "shell and its child to be killed", func() bool {
				for _, pid := range pids {
					if syscall.Kill(pid, 0) == nil && !isZombie(pid) {
						return false
					}
				}
				return true
			})
			t.Logf("process group gone %s after cancel", time.Since(start).Round(time.Millisecond))
		})
	}
}

func isZombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	f := strings.Fields(string(data))
	return len(f) > 2 && f[2] == "Z"
}

func TestBashTruncationAndDaemons(t *testing.T) {
	env := NewEnv(t)
	cs := env.Client("", nil)
	out := mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "seq 1 100000"}))
	m := regexp.MustCompile(`\[Showing lines (\d+)-(\d+) of (\d+)\. Full output: (\S+)\]$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no truncation note at the end of %q", out[len(out)-200:])
	}
	if m[2] != "100000" || m[3] != "100000" {
		t.Fatalf("note says lines %s-%s of %s", m[1], m[2], m[3])
	}
	full := mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "wc -l < " + m[4]}))
	if strings.TrimSpace(full) != "100000" {
		t.Fatalf("full output file has %q lines", full)
	}

	start := time.Now()
	got := mustOK(t, call(t, cs, "bash", map[string]any{"host": "alpha", "command": "(sleep 30 &); echo started"}))
	if got != "started\n" || time.Since(start) > 5*time.Second {
		t.Fatalf("daemon command returned %q after %s", got, time.Since(start))
	}

	res := call(t, cs, "bash", map[string]any{"host": "alpha", "command": "echo partial; sleep 10", "timeout": 1})
	mustErr(t, res, "partial\n\nCommand timed out after 1 second")
}

func TestConcurrentClientsSameRequestIDs(t *testing.T) {
	env := NewEnv(t)
	const clients, calls = 8, 10
	sessions := make([]*mcp.ClientSession, clients)
	for i := range sessions {
		sessions[i] = env.Client(eras[i%2].Version, nil)
	}
	var wg sync.WaitGroup
	for i, cs := range sessions {
		wg.Go(func() {
			for j := range calls {
				want := fmt.Sprintf("client-%d-call-%d", i, j)
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "bash", Arguments: map[string]any{"host": "alpha", "command": "echo " + want}})
				if err != nil {
					t.Errorf("client %d: %v", i, err)
					return
				}
				if got := text(res); got != want+"\n" {
					t.Errorf("client %d call %d got %q", i, j, got)
				}
			}
		})
	}
	wg.Wait()
}
