package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

var tokenCreateCmd = &command{
	group: "token", name: "create", args: "",
	summary: "make a join token a host enrols with (shown once)",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		labels := fs.String("labels", "", "labels every host enrolled with the token gets, k=v,k2=v2")
		ttl := fs.Duration("ttl", time.Hour, "how long the token may be used (at most 720h)")
		uses := fs.Int("uses", 1, "how many hosts may enrol with it")
		name := fs.String("name", "", "the one host name it enrols")
		pattern := fs.String("name_pattern", "", "a pattern host names must match, e.g. web-* (default: any name)")
		replace := fs.String("replace", "", "a host name the token may take over from its old key, even a revoked one (the old key is revoked)")
		overNATS := fs.Bool("nats", false, "make a NATS join token, for hosts that reach the gateway's NATS server (4222) but not its fleet API (8443)")
		return func(ctx context.Context, c *cli, args []string) error {
			if err := c.wantArgs(args, 0); err != nil {
				return err
			}
			req, err := tokenRequest(*labels, *ttl, *uses, *name, *pattern, *replace)
			if err != nil {
				return err
			}
			req.NATS = *overNATS
			var resp protocol.TokenCreateResponse
			if printed, err := c.ask(ctx, http.MethodPost, protocol.AdminTokensPath, req, &resp); err != nil || printed {
				return err
			}
			c.printCreated(&resp)
			return nil
		}
	},
}

// tokenRequest checks the flags of token create.
func tokenRequest(labels string, ttl time.Duration, uses int, name, pattern, replace string) (*protocol.TokenCreateRequest, error) {
	l, err := protocol.ParseLabels(labels)
	if err != nil {
		return nil, usagef("--labels: %v", err)
	}
	if ttl <= 0 {
		return nil, usagef("--ttl %s: give a positive duration, e.g. 1h", ttl)
	}
	if uses < 1 {
		return nil, usagef("--uses %d: a token enrols at least one host", uses)
	}
	if name != "" && pattern != "" {
		return nil, usagef("--name and --name_pattern both given: a token enrols one named host, or hosts whose names match a pattern")
	}
	for flagName, v := range map[string]string{"--name": name, "--replace": replace} {
		if v != "" {
			if err := protocol.ValidateHost(v); err != nil {
				return nil, usagef("%s: %v", flagName, err)
			}
		}
	}
	if pattern != "" && strings.TrimSpace(pattern) != pattern {
		return nil, usagef("--name_pattern %q has spaces around it", pattern)
	}
	return &protocol.TokenCreateRequest{Labels: l, TTL: ttl.String(), Uses: uses, Name: name, NamePattern: pattern, Replace: replace}, nil
}

func (c *cli) printCreated(r *protocol.TokenCreateResponse) {
	w := c.stdout
	what := "Join token"
	if r.Info.NATS {
		what = "NATS join token (with its credential to enrol over NATS)"
	}
	fmt.Fprintf(w, "%s (shown this once: the gateway keeps only its hash; copy it now):\n\n    %s\n\n", what, r.Token)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  id:\t%s\n", r.Info.ID)
	fmt.Fprintf(tw, "  expires:\t%s (in %s)\n", formatTime(r.Info.ExpiresAt), r.Info.ExpiresAt.Sub(c.now()).Round(time.Second))
	fmt.Fprintf(tw, "  uses:\t%d\n", r.Info.Uses)
	fmt.Fprintf(tw, "  hosts:\t%s\n", tokenNames(&r.Info))
	fmt.Fprintf(tw, "  labels:\t%s\n", formatLabels(r.Info.Labels))
	if r.CAPin != "" {
		fmt.Fprintf(tw, "  CA pin:\t%s\n", r.CAPin)
	}
	if len(r.NATSURLs) > 0 {
		fmt.Fprintf(tw, "  NATS:\t%s\n", strings.Join(r.NATSURLs, ", "))
	}
	tw.Flush()
	fmt.Fprintf(w, "\nOn the host, run this and paste the token when it asks (or pipe it in: it reads the token from standard input, out of ps and the shell's history):\n\n    %s\n", r.JoinCommand)
	if r.InstallCommand != "" {
		fmt.Fprintf(w, "\nor, as root, install the agent as a system service and join:\n\n    %s\n", r.InstallCommand)
	}
	if r.Info.NATS {
		// Longer than some terminals take on one line (macOS: 1024 bytes).
		fmt.Fprintf(w, "\nThe token is long (%d characters): rather than paste it at the prompt, save it in a file and redirect it in (... --token_file - < FILE).\n", len(r.Token))
	}
}

// tokenNames says which host names a token enrols.
func tokenNames(t *protocol.TokenInfo) string {
	s := "any name"
	switch {
	case t.Name != "":
		s = t.Name
	case t.NamePattern != "":
		s = "pattern " + t.NamePattern
	}
	if t.Replace != "" {
		s += " (replaces " + t.Replace + ")"
	}
	return s
}

var tokenListCmd = &command{
	group: "token", name: "list", args: "",
	summary: "list join tokens: state, uses, names, labels, expiry",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		return func(ctx context.Context, c *cli, args []string) error {
			if err := c.wantArgs(args, 0); err != nil {
				return err
			}
			var list protocol.TokenList
			if printed, err := c.ask(ctx, http.MethodGet, protocol.AdminTokensPath, nil, &list); err != nil || printed {
				return err
			}
			c.printTokens(list.Tokens)
			return nil
		}
	},
}

func (c *cli) printTokens(tokens []protocol.TokenInfo) {
	if len(tokens) == 0 {
		fmt.Fprintln(c.stdout, "No join tokens. Make one with: fleetctl token create --labels k=v --ttl 1h")
		return
	}
	sort.SliceStable(tokens, func(i, j int) bool { return tokens[i].CreatedAt.Before(tokens[j].CreatedAt) })
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tUSES\tHOSTS\tLABELS\tEXPIRES\tCREATED BY")
	for i := range tokens {
		t := &tokens[i]
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\t%s\t%s\n", t.ID, orDash(t.State), t.Used, t.Uses, tokenNames(t),
			formatLabels(t.Labels), formatTime(t.ExpiresAt), orDash(t.CreatedBy))
	}
	tw.Flush()
}

var tokenRevokeCmd = &command{
	group: "token", name: "revoke", args: "ID",
	summary: "revoke a join token: no host can enrol with it any more",
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		return func(ctx context.Context, c *cli, args []string) error {
			if err := c.wantArgs(args, 1); err != nil {
				return err
			}
			id := args[0]
			// The whole token names its id too.
			if tid, _, err := protocol.ParseJoinToken(id); err == nil {
				id = tid
			}
			if err := protocol.CheckTokenID(id); err != nil {
				return usagef("%v: give the ID column of fleetctl token list", err)
			}
			var info protocol.TokenInfo
			if printed, err := c.ask(ctx, http.MethodDelete, protocol.AdminTokensPath+"/"+id, nil, &info); err != nil || printed {
				return err
			}
			fmt.Fprintf(c.stdout, "Token %s revoked: no host can enrol with it any more (hosts that enrolled with it stay enrolled).\n", id)
			return nil
		}
	},
}

// formatTime writes a time in UTC to the minute ("-": none).
func formatTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04Z")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
