package main

import (
	"regexp"
	"strings"
	"testing"
)

// printedCommand finds the fleetctl commands an output suggests.
var printedCommand = regexp.MustCompile(`fleetctl (?:token|agent|skills|audit|login|doctor|completion|help)\b[^\n):]*`)

// The fleetctl commands fleetctl prints (what to run next, how to follow
// a rollout, how to make a token) are commands fleetctl takes: each
// parses with its own flag set.
func TestPrintedFleetctlCommandsParse(t *testing.T) {
	g := startFakeGateway(t)
	g.mu.Lock()
	clear(g.tokens)
	clear(g.agents)
	g.mu.Unlock()
	var outs []string
	for _, args := range [][]string{
		{"token", "list"}, {"agent", "list"},
		{"token", "create", "--name", "web-1"},
		{"skills", "rollout", "deploy", "--selector", "role=web"},
		{"skills", "remove", "deploy", "--selector", "role=web"},
	} {
		r := fleetctl(t, adminEnv(g), args...)
		outs = append(outs, r.stdout, r.stderr)
	}
	seen := map[string]bool{}
	for _, out := range outs {
		for _, cmd := range printedCommand.FindAllString(out, -1) {
			cmd = strings.TrimRight(strings.TrimSpace(cmd), ".,;")
			if seen[cmd] {
				continue
			}
			seen[cmd] = true
			args := strings.Fields(cmd)[1:]
			r := fleetctl(t, adminEnv(g), append(args, "-h")...)
			if r.code != 0 || strings.Contains(r.stderr, "not defined") {
				t.Errorf("printed %q does not parse: exit %d\n%s", cmd, r.code, r.stderr)
			}
		}
	}
	for _, want := range []string{"fleetctl token create --labels k=v --ttl 1h", "fleetctl skills status r-bbbbbbbbbb --wait", "fleetctl skills status r-remove0001 --wait"} {
		if !seen[want] {
			t.Errorf("fleetctl did not print %q (it printed %v)", want, seen)
		}
	}
}
