package gateway

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
)

// finishRecord turns a call's result into the audit outcome.
func TestFinishRecord(t *testing.T) {
	g := &Gateway{}
	text := func(isError bool, s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{IsError: isError, Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	tests := []struct {
		name, tool string
		res        *mcp.CallToolResult
		err        error
		noted      string
		outcome    string
		exit       int // -1: none
		errText    string
		background bool
	}{
		{"bash ok", "bash", text(false, "hi\n"), nil, "", audit.OutcomeOK, 0, "", false},
		{"bash exit", "bash", text(true, "out\n\nCommand exited with code 2"), nil, "", audit.OutcomeError, 2, "Command exited with code 2", false},
		{"bash timeout", "bash", text(true, "x\n\nCommand timed out after 5 seconds"), nil, "", audit.OutcomeTimedOut, -1, "Command timed out after 5 seconds", false},
		{"read error", "read", text(true, "host alpha: no such file"), nil, "", audit.OutcomeError, -1, "host alpha: no such file", false},
		{"cancelled", "bash", text(true, "bash on alpha was cancelled"), nil, audit.OutcomeCancelled, audit.OutcomeCancelled, -1, "bash on alpha was cancelled", false},
		{"host timeout", "read", text(true, "read on alpha did not finish within 1m0s"), nil, audit.OutcomeTimedOut, audit.OutcomeTimedOut, -1, "read on alpha did not finish within 1m0s", false},
		{"protocol error", "nope", nil, errors.New("unknown tool \"nope\""), "", audit.OutcomeError, -1, "unknown tool \"nope\"", false},
		{"secret in an error", "read", text(true, "cannot read TOKEN=abc"), nil, "", audit.OutcomeError, -1, "cannot read TOKEN=[redacted]", false},
		// Starting a background task says nothing about an exit code.
		{"background start", "bash", text(false, "Started background task t1"), nil, "", audit.OutcomeOK, -1, "", true},
	}
	for _, tc := range tests {
		rec := &audit.Record{Tool: tc.tool}
		var res mcp.Result
		if tc.res != nil {
			res = tc.res
		}
		g.finishRecord(rec, &callContext{outcome: tc.noted, background: tc.background}, res, tc.err)
		exit := -1
		if rec.ExitCode != nil {
			exit = *rec.ExitCode
		}
		if rec.Outcome != tc.outcome || exit != tc.exit || rec.Error != tc.errText {
			t.Errorf("%s: outcome %q exit %d error %q, want %q %d %q", tc.name, rec.Outcome, exit, rec.Error, tc.outcome, tc.exit, tc.errText)
		}
	}
}

func TestHostArg(t *testing.T) {
	for raw, want := range map[string]string{
		`{"host":"web-1","path":"x"}`: "web-1",
		`{"host":7}`:                  "",
		`{}`:                          "",
		`[1]`:                         "",
		``:                            "",
	} {
		if got := hostArg([]byte(raw)); got != want {
			t.Errorf("hostArg(%s) = %q, want %q", raw, got, want)
		}
	}
}

// TestCallCountDrain: drain waits for the calls in progress and refuses
// new ones, also while calls begin and end around it on other goroutines
// (run with -race: a WaitGroup whose Add may follow its Wait is not).
func TestCallCountDrain(t *testing.T) {
	var c callCount
	if !c.begin() {
		t.Fatal("a call refused before any drain")
	}
	idle := c.drain()
	select {
	case <-idle:
		t.Fatal("drained with a call in progress")
	default:
	}
	if c.begin() {
		t.Error("a call taken in while draining")
	}
	c.end()
	select {
	case <-idle:
	case <-time.After(5 * time.Second):
		t.Fatal("not drained once the last call ended")
	}
	if c.drain() != idle {
		t.Error("a second drain made a new channel")
	}

	var d callCount
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				if d.begin() {
					d.end()
				}
			}
		})
	}
	<-d.drain()
	wg.Wait()
	if d.begin() {
		t.Error("a call taken in after the drain")
	}
}
