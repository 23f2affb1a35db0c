package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// A builtCommand is a Go command the tests run as a process, built once
// per test binary into a temporary directory that Main removes.
type builtCommand struct {
	name, pkg string // the binary's name, the package built
	once      sync.Once
	path      string
	err       error
}

var (
	agentCommand      = &builtCommand{name: "fleet-agent", pkg: "github.com/fleetmcp/fleetmcp/cmd/fleet-agent"}
	gatewayCommand    = &builtCommand{name: "fleet-gateway", pkg: "github.com/fleetmcp/fleetmcp/cmd/fleet-gateway"}
	fleetctlCommand   = &builtCommand{name: "fleetctl", pkg: "github.com/fleetmcp/fleetmcp/cmd/fleetctl"}
	natsServerCommand = &builtCommand{name: "nats-server", pkg: "github.com/nats-io/nats-server/v2"}
	builtCommands     = []*builtCommand{agentCommand, gatewayCommand, fleetctlCommand, natsServerCommand}
)

// binary builds the command the first time it is asked for, and returns
// its path; a build that failed fails t.
func (c *builtCommand) binary(t testing.TB) string {
	t.Helper()
	c.once.Do(func() {
		dir, err := os.MkdirTemp("", c.name+"-bin")
		if err != nil {
			c.err = err
			return
		}
		c.path = filepath.Join(dir, c.name)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", c.path, c.pkg).CombinedOutput(); err != nil {
			c.err = fmt.Errorf("go build %s: %w\n%s", c.name, err, out)
		}
	})
	if c.err != nil {
		t.Fatal(c.err)
	}
	return c.path
}

// removeBuilt removes the commands built.
func removeBuilt() {
	for _, c := range builtCommands {
		if c.path != "" {
			os.RemoveAll(filepath.Dir(c.path))
		}
	}
}
