package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"sort"
	"text/tabwriter"

	"github.com/fleetmcp/fleetmcp/protocol"
)

var agentListCmd = &command{
	group: "agent", name: "list", args: "",
	summary: "list enrolled hosts: online or revoked, labels, OS/arch, credential expiry, recoveries left",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		return func(ctx context.Context, c *cli, args []string) error {
			if err := c.wantArgs(args, 0); err != nil {
				return err
			}
			var list protocol.AgentList
			if printed, err := c.ask(ctx, http.MethodGet, protocol.AdminAgentsPath, nil, &list); err != nil || printed {
				return err
			}
			c.printAgents(list.Agents)
			return nil
		}
	},
}

func (c *cli) printAgents(agents []protocol.AgentInfo) {
	if len(agents) == 0 {
		fmt.Fprintln(c.stdout, "No enrolled hosts. Make a join token with: fleetctl token create --labels k=v")
		return
	}
	sort.SliceStable(agents, func(i, j int) bool { return agents[i].Host < agents[j].Host })
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tSTATE\tLABELS\tOS/ARCH\tCREDENTIAL EXPIRES\tRECOVERIES")
	for i := range agents {
		a := &agents[i]
		osArch := "-"
		if a.Facts.OS != "" || a.Facts.Arch != "" {
			osArch = orDash(a.Facts.OS) + "/" + orDash(a.Facts.Arch)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", a.Host, agentState(a), formatLabels(a.Labels), osArch,
			formatTime(a.CredentialExpiresAt), a.RecoveriesLeft)
	}
	tw.Flush()
}

// agentState says whether a host is revoked, online or offline.
func agentState(a *protocol.AgentInfo) string {
	switch {
	case !a.RevokedAt.IsZero():
		return "revoked"
	case a.Online:
		return "online"
	}
	return "offline"
}

var agentRevokeCmd = &command{
	group: "agent", name: "revoke", args: "NAME | --key PUBKEY",
	summary: "revoke a host (or one agent key): its credential stops working and its connections are closed, whatever its record says",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		key := fs.String("key", "", "revoke this agent key (U...) instead of a host by name: for a key no record names, or a host whose record is gone")
		return func(ctx context.Context, c *cli, args []string) error {
			if *key != "" {
				return c.revokeKey(ctx, *key, args)
			}
			host, err := c.hostArg(args, 1)
			if err != nil {
				return err
			}
			if printed, err := c.agentAction(ctx, host, "revoke", nil, nil); err != nil || printed {
				return err
			}
			fmt.Fprintf(c.stdout, "Host %s revoked: its credential no longer works and its connection is closed.\n"+
				"It can enrol again only with a token made with --replace %s.\n", host, host)
			return nil
		}
	},
}

// userKeyShape reports whether key looks like an nkey user public key
// (the gateway checks it fully).
func userKeyShape(key string) bool {
	if len(key) != 56 || key[0] != 'U' {
		return false
	}
	for _, r := range key {
		if (r < 'A' || r > 'Z') && (r < '2' || r > '7') {
			return false
		}
	}
	return true
}

// revokeKey revokes one agent key (agent revoke --key).
func (c *cli) revokeKey(ctx context.Context, key string, args []string) error {
	if len(args) != 0 {
		return usagef("agent revoke --key takes no host name (got %q): the gateway finds the host the key belongs to", args)
	}
	if !userKeyShape(key) {
		return usagef("--key %q is not an agent's public key (an nkey user key: U and 55 more letters A-Z and digits 2-7; fleetctl agent list shows them)", key)
	}
	var resp protocol.KeyRevokeResponse
	if printed, err := c.ask(ctx, http.MethodPost, protocol.AdminKeysPath+"/"+key+"/revoke", nil, &resp); err != nil || printed {
		return err
	}
	if resp.Host == "" {
		fmt.Fprintf(c.stdout, "Key %s revoked: no credential issued for it works any more (no host is known for it).\n", key)
		return nil
	}
	fmt.Fprintf(c.stdout, "Key %s of host %s revoked: its credential no longer works and its connections are closed.\n", key, resp.Host)
	return nil
}

var agentLabelCmd = &command{
	group: "agent", name: "label", args: "NAME KEY=VALUE... KEY-...",
	summary: "set (key=value) or remove (key-) a host's labels",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		return func(ctx context.Context, c *cli, args []string) error {
			if len(args) < 2 {
				return usagef("agent label takes a host name and at least one change: fleetctl agent label web-1 env=prod tier-")
			}
			host, err := c.hostArg(args[:1], 1)
			if err != nil {
				return err
			}
			edits, err := parseLabelEdits(args[1:])
			if err != nil {
				return usagef("%v", err)
			}
			req := &protocol.LabelsRequest{Set: edits.Set, Remove: edits.Remove}
			if len(req.Set) == 0 {
				req.Set = nil
			}
			var info protocol.AgentInfo
			if printed, err := c.agentAction(ctx, host, "labels", req, &info); err != nil || printed {
				return err
			}
			if info.Host != "" {
				fmt.Fprintf(c.stdout, "Labels of %s: %s\n", host, formatLabels(info.Labels))
			} else {
				fmt.Fprintf(c.stdout, "Labels of %s changed.\n", host)
			}
			return nil
		}
	},
}

var agentRecoveryCmd = &command{
	group: "agent", name: "allow-recovery", args: "NAME",
	summary: "let a host whose credential expired get a new one with its key",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		count := fs.Int("count", 1, "how many more recoveries the host may make")
		return func(ctx context.Context, c *cli, args []string) error {
			host, err := c.hostArg(args, 1)
			if err != nil {
				return err
			}
			if *count < 1 {
				return usagef("--count %d: allow at least one recovery", *count)
			}
			var info protocol.AgentInfo
			if printed, err := c.agentAction(ctx, host, "allow-recovery", &protocol.AllowRecoveryRequest{Count: *count}, &info); err != nil || printed {
				return err
			}
			left := *count
			if info.Host != "" {
				left = info.RecoveriesLeft
			}
			fmt.Fprintf(c.stdout, "Host %s may recover %d more time(s): its agent does so by itself when its credential has expired.\n", host, left)
			return nil
		}
	},
}

// hostArg checks that args is one valid host name.
func (c *cli) hostArg(args []string, n int) (string, error) {
	if err := c.wantArgs(args, n); err != nil {
		return "", err
	}
	if err := protocol.ValidateHost(args[0]); err != nil {
		return "", usagef("%v", err)
	}
	return args[0], nil
}

// agentAction posts body to AdminAgentsPath/host/action (as ask does);
// out gets the host as the gateway now describes it, when it does.
func (c *cli) agentAction(ctx context.Context, host, action string, body, out any) (printed bool, err error) {
	return c.ask(ctx, http.MethodPost, protocol.AdminAgentsPath+"/"+host+"/"+action, body, out)
}
