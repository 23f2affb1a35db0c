package main

import (
	"os"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent"
)

// TestMain lets the test binary confine commands, as the real binary
// does: the agents the tests run give it as their ConfineHelper.
func TestMain(m *testing.M) {
	if code, ok := agent.RunConfined(os.Args); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}
