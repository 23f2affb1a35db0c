package main

import (
	"testing"

	"github.com/fleetmcp/fleetmcp/agent/install"
)

// The state directory install -h shows is the one install uses.
func TestServiceStateDirIsInstalls(t *testing.T) {
	if got := serviceStateDir(env(nil)); got != install.LinuxStateDir {
		t.Errorf("serviceStateDir = %s; install uses %s", got, install.LinuxStateDir)
	}
}
