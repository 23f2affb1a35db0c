package agent

import (
	"os"
	"testing"
)

// TestMain lets the test binary run the git guard: the toolboxes the tests
// build under command rules give it as their GitGuard.
func TestMain(m *testing.M) {
	if code, ok := RunGitGuard(os.Args); ok {
		os.Exit(code)
	}
	if code, ok := RunConfined(os.Args); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}
