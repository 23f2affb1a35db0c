package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

var skillListCmd = &command{
	group: "skills", name: "list", args: "",
	summary: "list pushed skills: the version served, versions pushed, last rollout",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		return func(ctx context.Context, c *cli, args []string) error {
			if err := c.wantArgs(args, 0); err != nil {
				return err
			}
			var list []protocol.SkillInfo
			if printed, err := c.ask(ctx, http.MethodGet, protocol.AdminSkillsPath, nil, &list); err != nil || printed {
				return err
			}
			if len(list) == 0 {
				fmt.Fprintln(c.stdout, "No skills pushed. Push one with: fleetctl skills push DIR")
				return nil
			}
			sort.Slice(list, func(i, j int) bool { return list[i].Name < list[j].Name })
			tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSERVED\tVERSIONS\tLAST PUSHED\tLAST ROLLOUT\tDESCRIPTION")
			for _, s := range list {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", s.Name, shortBundle(s.Served), s.Versions, formatTime(s.LastPushed),
					orDash(s.LastRollout), orDash(protocol.Clip(oneLine(s.Description), 60)))
			}
			return tw.Flush()
		}
	},
}

var skillVersionsCmd = &command{
	group: "skills", name: "versions", args: "NAME",
	summary: "list a skill's pushed versions, newest first",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		return func(ctx context.Context, c *cli, args []string) error {
			name, err := c.skillArg(args)
			if err != nil {
				return err
			}
			var vs []protocol.SkillVersion
			if printed, err := c.ask(ctx, http.MethodGet, skillPath(name), nil, &vs); err != nil || printed {
				return err
			}
			tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "BUNDLE\tFILES\tBYTES\tPUSHED\tPUSHED BY")
			for _, v := range vs {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", v.BundleID, v.Files, v.Bytes, formatTime(v.PushedAt), orDash(v.PushedBy))
			}
			return tw.Flush()
		}
	},
}

var skillRolloutCmd = &command{
	group: "skills", name: "rollout", args: "NAME[@BUNDLE]",
	summary: "roll a pushed version out to the hosts a selector picks (default: the latest); prints the rollout id",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		selector := fs.String("selector", "", `the hosts: a name glob and labels, e.g. "web-*", role=web, "*" for all (required)`)
		canary := fs.Int("canary", 1, "how many online hosts install first, alone (0: none)")
		batch := fs.String("batch", "25%", "how many hosts install at once after the canary: N, or N% of the hosts")
		maxErrors := fs.Int("max_errors", 0, "how many hosts may fail before the rollout pauses")
		autoRollback := fs.Bool("auto_rollback", false, "roll back instead of pausing when more than --max_errors hosts fail")
		batchTimeout := fs.Duration("batch_timeout", 10*time.Minute, "how long an online host may take to install before it counts as failed")
		w := waitFlags(fs)
		return func(ctx context.Context, c *cli, args []string) error {
			if err := c.wantArgs(args, 1); err != nil {
				return err
			}
			name, bundle, _ := strings.Cut(args[0], "@")
			if err := protocol.ValidateSkillName(name); err != nil {
				return usagef("%v", err)
			}
			req, err := rolloutRequest(name, *selector, *canary, *batch, *maxErrors, *autoRollback, *batchTimeout)
			if err != nil {
				return err
			}
			if req.BundleID, err = c.resolveBundle(ctx, name, bundle); err != nil {
				return err
			}
			if err := w.check(); err != nil {
				return err
			}
			var info protocol.RolloutInfo
			printed, err := c.ask(ctx, http.MethodPost, protocol.AdminRolloutsPath, req, &info)
			if err != nil {
				return err
			}
			if !printed {
				fmt.Fprintf(c.stdout, "Rollout %s started: %s %s to %d hosts in %d batches.\n", info.ID, info.Skill, info.BundleID, info.Hosts, info.Batches)
				if !*w.wait {
					fmt.Fprintf(c.stdout, "Follow it with: fleetctl skills status %s --wait\n", info.ID)
				}
			}
			return c.maybeWait(ctx, w, info.ID)
		}
	},
}

// rolloutRequest checks the flags of skills rollout.
func rolloutRequest(name, selector string, canary int, batch string, maxErrors int, autoRollback bool, timeout time.Duration) (*protocol.RolloutRequest, error) {
	switch {
	case strings.TrimSpace(selector) == "":
		return nil, usagef(`--selector is required: which hosts? e.g. --selector role=web, --selector "web-*", --selector "*" for all`)
	case canary < 0:
		return nil, usagef("--canary %d: give 0 (no canary) or more", canary)
	case maxErrors < 0:
		return nil, usagef("--max_errors %d: give 0 or more", maxErrors)
	case timeout < time.Second || timeout > 24*time.Hour:
		return nil, usagef("--batch_timeout %s: give a duration from 1s to 24h, e.g. 10m", timeout)
	}
	if err := checkBatch(batch); err != nil {
		return nil, err
	}
	return &protocol.RolloutRequest{Skill: name, Selector: selector, Canary: &canary, Batch: batch, MaxErrors: maxErrors,
		AutoRollback: autoRollback, BatchTimeout: timeout.String()}, nil
}

// checkBatch checks --batch: a positive count, or a percentage from 1 to
// 100.
func checkBatch(batch string) error {
	num, pct := strings.CutSuffix(batch, "%")
	n, err := strconv.Atoi(num)
	switch {
	case err != nil || n < 1:
		return usagef("--batch %q: give a number of hosts (e.g. 5) or a percentage of them (e.g. 25%%)", batch)
	case pct && n > 100:
		return usagef("--batch %q: a percentage is at most 100%%", batch)
	}
	return nil
}

// resolveBundle turns the BUNDLE of NAME@BUNDLE into a bundle id: a whole
// id as it is, or a prefix of one of the skill's versions (with or
// without "sha256:") when it names exactly one. Empty: the latest.
func (c *cli) resolveBundle(ctx context.Context, name, bundle string) (string, error) {
	if bundle == "" {
		return "", nil
	}
	prefix := "sha256:" + strings.TrimPrefix(bundle, "sha256:")
	if len(prefix) == len("sha256:")+64 {
		return prefix, nil
	}
	if len(prefix) < len("sha256:")+6 {
		return "", usagef("%s@%s: give at least 6 hex digits of the bundle id (see fleetctl skills versions %s)", name, bundle, name)
	}
	cl, err := c.client()
	if err != nil {
		return "", err
	}
	var vs []protocol.SkillVersion
	if _, err := cl.call(ctx, http.MethodGet, skillPath(name), nil, &vs); err != nil {
		return "", err
	}
	var found []string
	for _, v := range vs {
		if strings.HasPrefix(v.BundleID, prefix) {
			found = append(found, v.BundleID)
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("skill %s has no version %s: see fleetctl skills versions %s", name, bundle, name)
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%s names %d versions of %s (%s): give more of the id", bundle, len(found), name, strings.Join(found, ", "))
}

var skillStatusCmd = &command{
	group: "skills", name: "status", args: "ROLLOUT",
	summary: "show a rollout: its state and batch, and where each host stands (--wait: follow it to its end)",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		w := waitFlags(fs)
		return func(ctx context.Context, c *cli, args []string) error {
			id, err := c.rolloutArg(args)
			if err != nil {
				return err
			}
			if err := w.check(); err != nil {
				return err
			}
			if *w.wait {
				return c.waitRollout(ctx, id, *w.poll)
			}
			var info protocol.RolloutInfo
			if printed, err := c.ask(ctx, http.MethodGet, rolloutPath(id)+"?hosts=1", nil, &info); err != nil || printed {
				return err
			}
			c.printRollout(&info)
			return nil
		}
	},
}

func (c *cli) printRollout(in *protocol.RolloutInfo) {
	w := c.stdout
	what := in.Skill + " " + in.BundleID
	if in.Remove {
		what = "remove " + in.Skill
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "Rollout:\t%s (%s)\n", in.ID, what)
	fmt.Fprintf(tw, "State:\t%s\n", rolloutProgress(in))
	if in.Reason != "" {
		fmt.Fprintf(tw, "Reason:\t%s\n", in.Reason)
	}
	fmt.Fprintf(tw, "Selector:\t%s (%d hosts)\n", in.Selector, in.Hosts)
	fmt.Fprintf(tw, "Settings:\tcanary %d, batch %s, max_errors %d, auto_rollback %t, batch_timeout %s\n",
		in.Canary, in.Batch, in.MaxErrors, in.AutoRollback, in.BatchTimeout)
	fmt.Fprintf(tw, "Hosts:\t%s\n", formatCounts(in.Counts))
	fmt.Fprintf(tw, "Created:\t%s by %s\n", formatTime(in.CreatedAt), orDash(in.CreatedBy))
	tw.Flush()
	hosts := in.HostStates
	if len(hosts) == 0 {
		hosts = in.Problems // more hosts than the gateway lists
	}
	if len(hosts) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tSTATE\tBUNDLE\tREASON")
	for _, h := range hosts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.Host, h.State, shortBundle(h.Active), orDash(oneLine(h.Reason)))
	}
	tw.Flush()
}

// batchNumber is the batch a rollout is at, counted from 1 (the API's
// current_batch counts from 0); a done rollout is past its last.
func batchNumber(in *protocol.RolloutInfo) int {
	if in.State == protocol.RolloutDone {
		return in.Batches
	}
	return min(in.CurrentBatch+1, in.Batches)
}

// rolloutProgress says a rollout's state and where it is.
func rolloutProgress(in *protocol.RolloutInfo) string {
	switch {
	case in.Batches == 0:
		return in.State
	case in.State == protocol.RolloutDone:
		return fmt.Sprintf("%s, all %d batches", in.State, in.Batches)
	}
	return fmt.Sprintf("%s, batch %d of %d", in.State, batchNumber(in), in.Batches)
}

// formatCounts writes per-state counts in a fixed order.
func formatCounts(counts map[string]int) string {
	order := []string{protocol.SkillInstalled, protocol.SkillRemoved, protocol.SkillInstalling, protocol.SkillPending,
		protocol.RolloutHostWaiting, protocol.RolloutHostSkipped, protocol.RolloutHostOffline, protocol.SkillFailed, protocol.SkillRefused, protocol.SkillTampered}
	var parts []string
	seen := map[string]bool{}
	for _, s := range order {
		if n := counts[s]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, s))
		}
		seen[s] = true
	}
	var rest []string
	for s := range counts {
		if !seen[s] && counts[s] > 0 {
			rest = append(rest, fmt.Sprintf("%d %s", counts[s], s))
		}
	}
	sort.Strings(rest)
	if parts = append(parts, rest...); len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// rolloutControlCmd makes the command that sends a rollout an action.
func rolloutControlCmd(action, summary, done string) *command {
	return &command{
		group: "skills", name: action, args: "ROLLOUT", summary: summary,
		flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
			return func(ctx context.Context, c *cli, args []string) error {
				id, err := c.rolloutArg(args)
				if err != nil {
					return err
				}
				var info protocol.RolloutInfo
				if printed, err := c.ask(ctx, http.MethodPost, rolloutPath(id)+"/"+action, nil, &info); err != nil || printed {
					return err
				}
				fmt.Fprintf(c.stdout, "Rollout %s %s: now %s.\n", info.ID, done, info.State)
				return nil
			}
		},
	}
}

var (
	skillPauseCmd    = rolloutControlCmd(protocol.RolloutPause, "pause a rollout: no further batch starts", "paused")
	skillResumeCmd   = rolloutControlCmd(protocol.RolloutResume, "resume a paused rollout (its failures so far no longer count)", "resumed")
	skillRollbackCmd = rolloutControlCmd(protocol.RolloutRollback, "roll a rollout back: its hosts go back to the version they had, or lose the skill", "rolled back")
)

var skillRemoveCmd = &command{
	group: "skills", name: "remove", args: "NAME",
	summary: "remove a skill from the hosts a selector picks (as a rollout); prints the rollout id",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		selector := fs.String("selector", "", `the hosts: a name glob and labels, e.g. "web-*", role=web, "*" for all (required)`)
		w := waitFlags(fs)
		return func(ctx context.Context, c *cli, args []string) error {
			name, err := c.skillArg(args)
			if err != nil {
				return err
			}
			if strings.TrimSpace(*selector) == "" {
				return usagef(`--selector is required: which hosts lose the skill? e.g. --selector role=web, --selector "*" for all`)
			}
			if err := w.check(); err != nil {
				return err
			}
			var info protocol.RolloutInfo
			printed, err := c.ask(ctx, http.MethodPost, skillPath(name)+"/remove", &protocol.SkillRemoveRequest{Selector: *selector}, &info)
			if err != nil {
				return err
			}
			if !printed {
				fmt.Fprintf(c.stdout, "Rollout %s started: remove %s from %d hosts.\n", info.ID, name, info.Hosts)
				if !*w.wait {
					fmt.Fprintf(c.stdout, "Follow it with: fleetctl skills status %s --wait\n", info.ID)
				}
			}
			return c.maybeWait(ctx, w, info.ID)
		}
	},
}

var skillRolloutsCmd = &command{
	group: "skills", name: "rollouts", args: "",
	summary: "list rollouts, newest first: skill, version, state, host counts",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		return func(ctx context.Context, c *cli, args []string) error {
			if err := c.wantArgs(args, 0); err != nil {
				return err
			}
			var list []protocol.RolloutInfo
			if printed, err := c.ask(ctx, http.MethodGet, protocol.AdminRolloutsPath, nil, &list); err != nil || printed {
				return err
			}
			if len(list) == 0 {
				fmt.Fprintln(c.stdout, "No rollouts. Start one with: fleetctl skills rollout NAME --selector SELECTOR")
				return nil
			}
			tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSKILL\tBUNDLE\tSTATE\tBATCH\tHOSTS\tCREATED\tCREATED BY")
			for _, r := range list {
				bundle := shortBundle(r.BundleID)
				if r.Remove {
					bundle = "(remove)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n", r.ID, r.Skill, bundle, r.State, batchNumber(&r), r.Batches,
					formatCounts(r.Counts), formatTime(r.CreatedAt), orDash(r.CreatedBy))
			}
			return tw.Flush()
		}
	},
}

// skillArg checks the one NAME argument.
func (c *cli) skillArg(args []string) (string, error) {
	if err := c.wantArgs(args, 1); err != nil {
		return "", err
	}
	if err := protocol.ValidateSkillName(args[0]); err != nil {
		return "", usagef("%v", err)
	}
	return args[0], nil
}

// rolloutArg checks the one ROLLOUT argument: an id as fleetctl skills
// rollouts lists them.
func (c *cli) rolloutArg(args []string) (string, error) {
	if err := c.wantArgs(args, 1); err != nil {
		return "", err
	}
	id := args[0]
	if len(id) > 64 || id == "" || strings.ContainsAny(id, "/?#%. \t\r\n") {
		return "", usagef("%q is not a rollout id: give the ID column of fleetctl skills rollouts (r-...)", protocol.Clip(id, 64))
	}
	return id, nil
}

// skillPath and rolloutPath are the API paths of a checked skill name
// and rollout id (nothing in them needs escaping).
func skillPath(name string) string { return protocol.AdminSkillsPath + "/" + name }
func rolloutPath(id string) string { return protocol.AdminRolloutsPath + "/" + id }
func oneLine(s string) string      { return strings.Join(strings.Fields(s), " ") }

// shortBundle shortens a bundle id for a table.
func shortBundle(id string) string {
	if id == "" {
		return "-"
	}
	if h := strings.TrimPrefix(id, "sha256:"); len(h) > 12 {
		return "sha256:" + h[:12]
	}
	return id
}
