package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/fleetmcp/fleetmcp/agent"
)

// TestMain lets the test binary confine commands, as the real binary
// does: the agents the tests run give it as their ConfineHelper.
func TestMain(m *testing.M) {
	if code, ok := agent.RunConfined(os.Args); ok {
		os.Exit(code)
	}
	dir, err := os.MkdirTemp("", "fleet-gateway-test-profile")
	if err != nil {
		panic(err)
	}
	testProfile = filepath.Join(dir, "fleetctl.json")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testProfile is where the tests' --dev gateways save fleetctl's profile.
var testProfile string
