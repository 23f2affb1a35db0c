package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strings"

	"github.com/fleetmcp/fleetmcp/cmd/internal/profile"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// topCommands are the commands of no group besides doctor and help.
var topCommands = map[string]func(*cli, context.Context, []string) error{
	"login":      (*cli).runLogin,
	"audit":      (*cli).runAudit,
	"completion": (*cli).runCompletion,
}

var (
	topCommandNames   = []string{"audit", "login", "completion"}
	topCommandArgs    = map[string]string{"login": "", "audit": "", "completion": "SHELL"}
	topCommandSummary = map[string]string{
		"login":      "check the gateway (--gateway, --ca_pin, --api_token_file) and save it as the profile later commands use",
		"audit":      "show the audit trail: --caller, --host, --tool, --decision, --since, --until, --limit",
		"completion": "print the completion script for bash, zsh or fish",
	}
)

// runLogin checks that the gateway answers as the flags say, then saves
// the profile.
func (c *cli) runLogin(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fleetctl login", flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	c.g.register(fs)
	noCheck := fs.Bool("no_check", false, "save without asking the gateway first")
	fs.StringVar(&c.g.conn.tokenFile, "token_file", c.g.conn.tokenFile, "the same as --api_token_file")
	fs.Usage = func() {
		fmt.Fprintf(c.stderr, `Usage: fleetctl login --gateway https://GATEWAY:8443 --ca_pin sha256:... [--api_token_file FILE|-]

Check the gateway's admin API with these settings, then save them as the
profile later commands use without flags. Flags and FLEET_* variables still
win over it. --api_token_file - (or --token_file -) reads the admin token
from standard input (asked for on a terminal); the profile keeps it.

Profile: %s (0600)

Flags:
`, c.profilePathOrDefault())
		printFlags(c.stderr, fs, func(name string) bool { return name != "json" })
	}
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return flagErr(err)
	}
	if len(pos) > 0 {
		return usagef("login takes no arguments (got %q): give --gateway URL", pos[0])
	}
	if c.profileErr != nil && c.profilePath == "" {
		return c.profileErr
	}
	conn := c.g.conn
	if conn.gateway == "" {
		return usagef("login needs --gateway https://GATEWAY:8443 (and --ca_pin sha256:..., as the gateway prints it)")
	}
	if conn.caFile != "" {
		return usagef("--ca_file: a profile keeps a CA pin, not a file; give --ca_pin (fleet-gateway prints it at start)")
	}
	if conn.tokenFile == "-" {
		tok, err := readLine(c.stdin, c.stderr, "Admin API token (paste it, then press Enter): ")
		if err != nil {
			return err
		}
		conn.token, conn.tokenFile = tok, ""
	}
	token, err := conn.adminToken()
	if err != nil {
		return err
	}
	conn.token, conn.tokenFile = token, ""
	cl, err := newClient(conn)
	if err != nil {
		return err
	}
	if !*noCheck {
		var list protocol.TokenList
		if _, err := cl.call(ctx, http.MethodGet, protocol.AdminTokensPath, nil, &list); err != nil {
			return fmt.Errorf("%w (nothing saved; --no_check saves anyway)", err)
		}
	}
	p := &profile.Profile{Gateway: cl.base.String(), CAPin: conn.caPin, APIToken: token}
	if err := profile.Save(c.profilePath, p); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "Saved the profile for %s in %s.\n", p.Gateway, c.profilePath)
	return nil
}

func (c *cli) profilePathOrDefault() string {
	if c.profilePath != "" {
		return c.profilePath
	}
	return "CONFIG_DIR/fleetmcp/fleetctl.json"
}

// readLine reads one line from r, asking for it on prompt when r is a
// terminal.
func readLine(r io.Reader, prompt io.Writer, ask string) (string, error) {
	if isTerminal(r) {
		fmt.Fprint(prompt, ask)
	}
	line, err := bufio.NewReader(io.LimitReader(r, 8<<10)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("reading standard input: %w", err)
	}
	line = strings.TrimSpace(line)
	if line == "" || strings.ContainsAny(line, " \t\r\n") {
		return "", errors.New("--api_token_file -: want one token on one line on standard input")
	}
	return line, nil
}

// isTerminal reports whether r is a terminal (a character device).
func isTerminal(r io.Reader) bool {
	f, ok := r.(interface{ Stat() (fs.FileInfo, error) })
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&fs.ModeCharDevice != 0
}
