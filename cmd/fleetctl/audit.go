package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// runAudit queries the audit trail.
func (c *cli) runAudit(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fleetctl audit", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	c.g.register(fs)
	filters := map[string]*string{
		"caller":   fs.String("caller", "", `only records whose caller's sub, email or client id contains this text ("token NAME" for an API token)`),
		"host":     fs.String("host", "", "only records that name this host"),
		"tool":     fs.String("tool", "", "only records of this tool (bash, write, admin_token_create, ...)"),
		"decision": fs.String("decision", "", "allowed or denied"),
		"since":    fs.String("since", "", "only records at or after this time: RFC 3339, or a duration back from now such as 1h"),
		"until":    fs.String("until", "", "only records before this time: RFC 3339, or a duration back from now"),
		"receipt":  fs.String("receipt", "", "only records whose host receipt is verified, has a problem, or none"),
	}
	limit := fs.Int("limit", 50, "how many of the newest matching records to show (at most 500)")
	fs.Usage = func() {
		fmt.Fprint(c.stderr, "Usage: fleetctl audit [flags]\n\nshow the newest records of the audit trail that match the filters, oldest first\n\nFlags:\n")
		printFlags(c.stderr, fs, func(name string) bool { return !globalFlags[name] })
		fmt.Fprintln(c.stderr, "\nGlobal flags: see fleetctl help")
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return flagErr(err)
	}
	if len(pos) > 0 {
		return usagef("audit takes no arguments (got %q): filter with --caller, --host, --tool, --decision, --since, --until", pos[0])
	}
	if *limit < 1 || *limit > 500 {
		return usagef("--limit %d: give 1 to 500", *limit)
	}
	q := url.Values{"limit": {fmt.Sprint(*limit)}}
	for _, k := range protocol.AuditFilter {
		if f := filters[k]; f != nil && *f != "" {
			q.Set(k, *f)
		}
	}
	var ans protocol.AuditAnswer
	if printed, err := c.ask(ctx, http.MethodGet, protocol.AdminAuditPath+"?"+q.Encode(), nil, &ans); err != nil || printed {
		return err
	}
	c.printAudit(&ans)
	return nil
}

func (c *cli) printAudit(ans *protocol.AuditAnswer) {
	if len(ans.Records) == 0 {
		fmt.Fprintf(c.stdout, "No matching records (%d searched).\n", ans.Scanned)
		return
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tCALLER\tTOOL\tWHERE\tDECISION\tOUTCOME\tDURATION\tDETAIL")
	for i := range ans.Records {
		r := &ans.Records[i]
		who := cmp.Or(r.Caller.Email, r.Caller.Subject)
		if r.Caller.Kind == "api_token" {
			who = "token " + r.Caller.Subject
		}
		where := strings.Join(r.Hosts, ",")
		if r.Target != "" {
			where = strings.TrimSpace(where + " " + r.Target)
		}
		outcome := r.Outcome
		if r.ExitCode != nil {
			outcome += fmt.Sprintf(" (exit %d)", *r.ExitCode)
		}
		detail := cmp.Or(r.Reason, r.Error)
		if r.Receipt != nil && r.Receipt.Problem != "" {
			detail = strings.TrimSpace(detail + " receipt: " + r.Receipt.Problem)
		}
		if r.Unsealed {
			detail = strings.TrimSpace("UNSEALED " + detail)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Time.UTC().Format(time.RFC3339), orDash(who), r.Tool, orDash(where),
			r.Decision, orDash(outcome), (time.Duration(r.DurationMS) * time.Millisecond).String(), orDash(protocol.Clip(oneLine(detail), 120)))
	}
	tw.Flush()
	fmt.Fprintf(c.stdout, "\n%d records (%d searched)", len(ans.Records), ans.Scanned)
	if ans.Unsealed > 0 {
		fmt.Fprintf(c.stdout, "; %d UNSEALED: not stored as a gateway of this fleet wrote them", ans.Unsealed)
	}
	if ans.Incomplete {
		fmt.Fprint(c.stdout, "; older records in the range were not searched: narrow it with --until")
	}
	fmt.Fprintln(c.stdout)
}
