package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// rolloutWait is the --wait and --poll flags of the commands that start
// or show a rollout.
type rolloutWait struct {
	wait *bool
	poll *time.Duration
}

func waitFlags(fs *flag.FlagSet) rolloutWait {
	return rolloutWait{
		wait: fs.Bool("wait", false, "follow the rollout until it ends, printing its progress: exit 0 when it is done, 1 when it pauses, is rolled back or superseded (for CI)"),
		poll: fs.Duration("poll", 2*time.Second, "with --wait: how often to ask the gateway"),
	}
}

func (w rolloutWait) check() error {
	if *w.poll < 100*time.Millisecond {
		return usagef("--poll %s: give at least 100ms, e.g. 2s", *w.poll)
	}
	return nil
}

// maybeWait follows rollout id when --wait was given.
func (c *cli) maybeWait(ctx context.Context, w rolloutWait, id string) error {
	if !*w.wait {
		return nil
	}
	return c.waitRollout(ctx, id, *w.poll)
}

// rolloutEndedError says that a followed rollout ended other than done.
type rolloutEndedError struct{ in *protocol.RolloutInfo }

func (e *rolloutEndedError) Error() string {
	msg := fmt.Sprintf("rollout %s ended %s", e.in.ID, e.in.State)
	if e.in.Reason != "" {
		msg += ": " + e.in.Reason
	}
	switch e.in.State {
	case protocol.RolloutPaused:
		msg += fmt.Sprintf(" (fleetctl skills status %s shows the hosts; then resume or rollback)", e.in.ID)
	default:
		msg += fmt.Sprintf(" (fleetctl skills status %s shows the hosts)", e.in.ID)
	}
	return msg
}

// waitRollout asks for rollout id every poll and prints a line when its
// progress changes, until it ends: nil when done, a rolloutEndedError
// when it paused, was rolled back or superseded. With --json it prints
// the last answer as it came.
func (c *cli) waitRollout(ctx context.Context, id string, poll time.Duration) error {
	cl, err := c.client()
	if err != nil {
		return err
	}
	last := ""
	for {
		var in protocol.RolloutInfo
		data, err := cl.call(ctx, http.MethodGet, rolloutPath(id), nil, &in)
		if err != nil {
			return err
		}
		ended := in.State != protocol.RolloutRunning
		if c.g.json {
			if ended {
				c.printJSON(data)
			}
		} else if line := rolloutProgress(&in) + "; hosts: " + formatCounts(in.Counts); line != last {
			fmt.Fprintf(c.stdout, "%s  %s\n", c.now().UTC().Format("15:04:05"), line)
			last = line
		}
		if ended {
			if !c.g.json {
				for _, h := range in.Problems {
					fmt.Fprintf(c.stdout, "  %s: %s: %s\n", h.Host, h.State, orDash(oneLine(h.Reason)))
				}
			}
			if in.State == protocol.RolloutDone {
				return nil
			}
			return &rolloutEndedError{in: &in}
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("stopped following rollout %s (it goes on): %w", id, ctx.Err())
		case <-t.C:
		}
	}
}
