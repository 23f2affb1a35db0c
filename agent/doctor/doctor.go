// Package doctor checks, without starting an agent, what an agent needs
// to run on its host: its state directory, its identity and credential,
// its host policy, the gateway's fleet API and the NATS servers it
// dials. An operator runs it (fleet-agent doctor) when a host does not
// show up in the fleet, to learn which of these is wrong and what to do
// about it, instead of reading the agent's log. Every check that touches
// the network is bounded by a timeout.
package doctor

import (
	"context"
	"fmt"
	"io"
	"time"
)

// Status is the outcome of one check.
type Status int

const (
	OK Status = iota
	Warn
	Fail
)

func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	default:
		return "FAIL"
	}
}

// Result is one check's outcome: what was checked, what was found and,
// unless it is fine, what to do.
type Result struct {
	Check  string
	Status Status
	Detail string
	Fix    string
}

// Options say what to check.
type Options struct {
	// StateDir is the agent's --state_dir; PolicyFile its host policy
	// (empty: none).
	StateDir, PolicyFile string
	// NATSURLs are the agent's --nats (FLEET_NATS_URL), which it dials
	// instead of the URLs it enrolled with; empty: those.
	NATSURLs []string
	// CheckPolicy parses the policy file as the agent would and returns
	// its summary (agent.CheckPolicy).
	CheckPolicy func(file string) ([]string, error)
	// StateDirHolder tells whether an agent holds the state directory
	// (agent.StateDirHolder).
	StateDirHolder func(dir string) (held bool, pid int, err error)
	// ConfineCommands is the agent's --confine_commands (auto, required
	// or off) and Cwd its working directory; ConfineABI reports the
	// kernel's Landlock ABI (default: confine.ABI).
	ConfineCommands, Cwd string
	ConfineABI           func() (int, string)
	// Timeout bounds each network check (default 10s).
	Timeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// UID is the user the agent runs as (default: this process's); -1
	// skips the owner check.
	UID int
}

// Run runs every check in order and returns the results. A check whose
// inputs an earlier one found broken is left out, not failed twice.
func Run(ctx context.Context, o Options) []Result {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ConfineABI == nil {
		o.ConfineABI = kernelABI
	}
	var rs []Result
	rs = append(rs, checkStateDir(o.StateDir, o.UID))
	id, idResults := checkIdentity(o.StateDir, o.Now())
	rs = append(rs, idResults...)
	rs = append(rs, checkPolicy(o.PolicyFile, o.CheckPolicy))
	rs = append(rs, checkConfinement(o.ConfineCommands, o.StateDir, o.Cwd, o.ConfineABI))
	if id != nil {
		rs = append(rs, checkFleetAPI(ctx, id.Enrolment.GatewayURL, id.Enrolment.CAPin, o.Timeout, o.Now)...)
		urls := id.Enrolment.NATSURLs
		if len(o.NATSURLs) > 0 {
			urls = o.NATSURLs
		}
		for _, u := range urls {
			rs = append(rs, checkNATS(ctx, u, id.Enrolment.NATSCA, o.Timeout, o.Now()))
		}
	}
	rs = append(rs, checkLock(o.StateDir, o.StateDirHolder))
	return rs
}

// Print writes one line per result and returns whether any failed.
func Print(w io.Writer, rs []Result) (failed bool) {
	for _, r := range rs {
		line := fmt.Sprintf("%-4s  %-16s %s", r.Status, r.Check, r.Detail)
		if r.Fix != "" && r.Status != OK {
			line += ": " + r.Fix
		}
		fmt.Fprintln(w, line)
		failed = failed || r.Status == Fail
	}
	return failed
}

// daysLeft says how long d is, in whole days (or less under two).
func daysLeft(d time.Duration) string {
	switch {
	case d < time.Hour:
		return d.Round(time.Minute).String()
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%d days", int(d.Hours()/24))
}
