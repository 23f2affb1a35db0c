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

var (
	ctlBuildOnce sync.Once
	ctlBinPath   string
	ctlBuildErr  error
)

// fleetctlBinary builds cmd/fleetctl once per test binary.
func fleetctlBinary(t testing.TB) string {
	ctlBuildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "fleetctl-bin")
		if err != nil {
			ctlBuildErr = err
			return
		}
		ctlBinPath = filepath.Join(dir, "fleetctl")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "go", "build", "-o", ctlBinPath, "github.com/fleetmcp/fleetmcp/cmd/fleetctl").CombinedOutput()
		if err != nil {
			ctlBuildErr = fmt.Errorf("go build fleetctl: %v\n%s", err, out)
		}
	})
	if ctlBuildErr != nil {
		t.Fatal(ctlBuildErr)
	}
	return ctlBinPath
}
