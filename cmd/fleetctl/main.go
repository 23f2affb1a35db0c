// Command fleetctl is the operator's tool for a fleetmcp fleet: it makes
// and revokes join tokens; lists, revokes, labels and lets recover
// enrolled hosts; and pushes skills and rolls them out, over the gateway's admin API (HTTPS, an admin bearer
// token). It speaks only the wire contract in protocol, so it stays a
// small binary that knows nothing of the gateway's insides.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fleetmcp/fleetmcp/cmd/internal/profile"
	"github.com/fleetmcp/fleetmcp/cmd/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// exitCode prints err and says how fleetctl exits: 0 done (or help
// asked for), 2 a command line fleetctl cannot use, 1 anything else.
func exitCode(err error, stderr io.Writer) int {
	var usage *usageError
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage):
		fmt.Fprintln(stderr, "fleetctl:", err)
		return 2
	}
	fmt.Fprintln(stderr, "fleetctl:", err)
	return 1
}

// usageError is a command line fleetctl cannot use.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// globals are the flags every command takes.
type globals struct {
	conn connection
	json bool
}

// register adds the global flags to fs, their defaults the values so far
// (the environment's, or what an earlier flag set parsed).
func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.conn.gateway, "gateway", g.conn.gateway, "the gateway's fleet API, https://HOST[:PORT] (env FLEET_GATEWAY)")
	fs.StringVar(&g.conn.token, "api_token", g.conn.token, "admin API token (env FLEET_API_TOKEN; prefer the env or --api_token_file: flags show in ps)")
	fs.StringVar(&g.conn.tokenFile, "api_token_file", g.conn.tokenFile, "file holding the admin API token")
	fs.StringVar(&g.conn.caPin, "ca_pin", g.conn.caPin, "trust only the gateway CA with this pin, sha256:HEX (env FLEET_CA_PIN)")
	fs.StringVar(&g.conn.caFile, "ca_file", g.conn.caFile, "trust the CA certificate(s) in this PEM file (default without --ca_pin: the system's CAs)")
	fs.BoolVar(&g.json, "json", g.json, "print the gateway's JSON answers as they are")
	fs.DurationVar(&g.conn.timeout, "timeout", g.conn.timeout, "how long a request may take")
}

var globalFlags = map[string]bool{"gateway": true, "api_token": true, "api_token_file": true, "ca_pin": true, "ca_file": true, "json": true, "timeout": true}

// cli is one run of fleetctl.
type cli struct {
	g              globals
	stdout, stderr io.Writer
	now            func() time.Time
	cmd            *command // the command running
	getenv         func(string) string
	stdin          io.Reader
	// profile is the saved profile (nil: none), profileErr why it
	// could not be read.
	profile     *profile.Profile
	profilePath string
	profileErr  error
}

// command is one fleetctl command.
type command struct {
	group, name string
	args        string // the positional arguments, for the usage line
	summary     string
	// flags adds the command's own flags to fs and returns what runs it
	// with the positional arguments.
	flags func(fs *flag.FlagSet) func(ctx context.Context, c *cli, args []string) error
}

func (cmd *command) path() string { return cmd.group + " " + cmd.name }

var commands = []*command{tokenCreateCmd, tokenListCmd, tokenRevokeCmd, agentListCmd, agentRevokeCmd, agentLabelCmd, agentRecoveryCmd,
	skillPushCmd, skillListCmd, skillVersionsCmd, skillRolloutCmd, skillStatusCmd, skillPauseCmd, skillResumeCmd, skillRollbackCmd,
	skillRemoveCmd, skillRolloutsCmd}

// isGroup says whether word is a command group.
func isGroup(word string) bool { return word == "token" || word == "agent" || word == "skills" }

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	c := &cli{stdout: stdout, stderr: stderr, now: time.Now, getenv: getenv, stdin: os.Stdin}
	c.loadProfile()
	c.g.conn = connection{gateway: getenv("FLEET_GATEWAY"), token: getenv("FLEET_API_TOKEN"), caPin: getenv("FLEET_CA_PIN"), timeout: 30 * time.Second}
	root := flag.NewFlagSet("fleetctl", flag.ContinueOnError)
	root.SetOutput(stderr)
	c.g.register(root)
	showVersion := root.Bool("version", false, "print the version, commit, build date and Go version, then exit")
	root.Usage = func() { c.usage(root) }
	if err := root.Parse(args); err != nil {
		return flagErr(err)
	}
	if *showVersion {
		version.Print(stdout, "fleetctl")
		return nil
	}
	words := root.Args()
	if len(words) == 0 {
		c.usage(root)
		return usagef("no command given")
	}
	group := words[0]
	if group == "help" {
		return c.help(root, words[1:])
	}
	if group == "doctor" {
		return c.runDoctor(ctx, words[1:])
	}
	if run, ok := topCommands[group]; ok {
		return run(c, ctx, words[1:])
	}
	if !isGroup(group) {
		return usagef("unknown command %q: see fleetctl help", group)
	}
	if len(words) < 2 || words[1] == "-h" || words[1] == "--help" || words[1] == "help" {
		c.groupUsage(group)
		if len(words) < 2 {
			return usagef("%s: which one? see above", group)
		}
		return flag.ErrHelp
	}
	cmd := findCommand(group, words[1])
	if cmd == nil {
		c.groupUsage(group)
		return usagef("unknown command %q", group+" "+words[1])
	}
	c.cmd = cmd
	fs := flag.NewFlagSet("fleetctl "+cmd.path(), flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.g.register(fs)
	runCmd := cmd.flags(fs)
	fs.Usage = func() { c.commandUsage(cmd, fs) }
	pos, err := parseInterspersed(fs, words[2:])
	if err != nil {
		return flagErr(err)
	}
	return runCmd(ctx, c, pos)
}

// flagErr turns a flag parsing error into a usage error (help stays help).
func flagErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &usageError{err.Error()}
}

// parseInterspersed parses flags wherever they are among the positional
// arguments (as `agent revoke web-1 --json`), and returns the positional
// ones; after "--" everything is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func findCommand(group, name string) *command {
	for _, cmd := range commands {
		if cmd.group == group && cmd.name == name {
			return cmd
		}
	}
	return nil
}

// client returns a client for the gateway the global flags name.
func (c *cli) client() (*client, error) {
	conn, err := c.connection()
	if err != nil {
		return nil, err
	}
	return newClient(conn)
}

// connection is what the flags and the environment say about reaching
// the gateway, completed by the saved profile: flags win over FLEET_*
// variables, which win over the profile. The profile's CA pin and token
// are used only for the profile's gateway, and only where no flag or
// variable gives a pin, CA file or token.
func (c *cli) connection() (connection, error) {
	conn := c.g.conn
	p := c.profile
	if c.profileErr != nil && conn.gateway == "" && c.profilePath != "" {
		// A profile that cannot be used (without one, the error is
		// that no gateway was given).
		return conn, c.profileErr
	}
	if p == nil || (conn.gateway != "" && strings.TrimSuffix(conn.gateway, "/") != strings.TrimSuffix(p.Gateway, "/")) {
		return conn, nil
	}
	conn.gateway = p.Gateway
	if conn.caPin == "" && conn.caFile == "" {
		conn.caPin = p.CAPin
	}
	if conn.token == "" && conn.tokenFile == "" {
		conn.token = p.APIToken
	}
	return conn, nil
}

// loadProfile reads the saved profile, if any.
func (c *cli) loadProfile() {
	c.profilePath, c.profileErr = profile.Path(c.getenv)
	if c.profileErr == nil {
		c.profile, c.profileErr = profile.Load(c.profilePath)
	}
}

// ask sends a request to the gateway and decodes its answer into out;
// with --json it prints the answer as it came instead, and says it did.
func (c *cli) ask(ctx context.Context, method, path string, body, out any) (printed bool, err error) {
	cl, err := c.client()
	if err != nil {
		return false, err
	}
	data, err := cl.call(ctx, method, path, body, out)
	if err != nil || !c.g.json {
		return false, err
	}
	c.printJSON(data)
	return true, nil
}

// printJSON prints an answer as the gateway gave it.
func (c *cli) printJSON(data []byte) {
	data = []byte(strings.TrimSpace(string(data)))
	if len(data) > 0 {
		fmt.Fprintf(c.stdout, "%s\n", data)
	}
}

// wantArgs checks the number of positional arguments.
func (c *cli) wantArgs(args []string, n int) error {
	if cmd := c.cmd; len(args) != n {
		return usagef("%s takes %s (got %d argument(s)): fleetctl %s %s", cmd.path(), cmd.args, len(args), cmd.path(), cmd.args)
	}
	return nil
}

const intro = `fleetctl manages a fleetmcp fleet through the gateway's admin API.

Usage: fleetctl [global flags] COMMAND [flags] [arguments]

Commands:
`

const outro = `
Global flags go before or after the command. The gateway's address, the
admin token and the CA pin come from, in this order: the flags; the
environment,
  FLEET_GATEWAY=https://gw.example.com:8443 FLEET_CA_PIN=sha256:... FLEET_API_TOKEN=fmcp_...
and the profile fleetctl login saves (FLEET_PROFILE names another file),
whose pin and token apply to its own gateway only.

"fleetctl COMMAND -h" describes a command and its flags.
`

func (c *cli) usage(root *flag.FlagSet) {
	fmt.Fprint(c.stderr, intro)
	for _, cmd := range commands {
		fmt.Fprintf(c.stderr, "  %-22s %s\n", cmd.path(), cmd.summary)
	}
	fmt.Fprintln(c.stderr, "  doctor                 check the admin API, the admin token, the clocks and the fleet's hosts")
	for _, name := range topCommandNames {
		fmt.Fprintf(c.stderr, "  %-22s %s\n", name+" "+topCommandArgs[name], topCommandSummary[name])
	}
	fmt.Fprintln(c.stderr, "  help [COMMAND]         this text, or a command's")
	fmt.Fprintln(c.stderr, "\nGlobal flags:")
	printFlags(c.stderr, root, func(name string) bool { return true })
	fmt.Fprint(c.stderr, outro)
}

func (c *cli) groupUsage(group string) {
	fmt.Fprintf(c.stderr, "Usage: fleetctl %s COMMAND [flags] [arguments]\n\n", group)
	for _, cmd := range commands {
		if cmd.group == group {
			fmt.Fprintf(c.stderr, "  %-22s %s\n", cmd.path(), cmd.summary)
		}
	}
}

func (c *cli) commandUsage(cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(c.stderr, "Usage: fleetctl %s [flags] %s\n\n%s\n", cmd.path(), cmd.args, cmd.summary)
	var own bool
	fs.VisitAll(func(f *flag.Flag) { own = own || !globalFlags[f.Name] })
	if own {
		fmt.Fprintln(c.stderr, "\nFlags:")
		printFlags(c.stderr, fs, func(name string) bool { return !globalFlags[name] })
	}
	fmt.Fprintln(c.stderr, "\nGlobal flags (--gateway, --api_token, --api_token_file, --ca_pin, --ca_file, --json, --timeout): see fleetctl help")
}

// help prints the usage of fleetctl, a group or a command.
func (c *cli) help(root *flag.FlagSet, words []string) error {
	switch len(words) {
	case 0:
		c.usage(root)
		return nil
	case 1:
		if isGroup(words[0]) {
			c.groupUsage(words[0])
			return nil
		}
		run, ok := topCommands[words[0]]
		if words[0] == "doctor" {
			run, ok = (*cli).runDoctor, true
		}
		if ok {
			if err := run(c, context.Background(), []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
				return err
			}
			return nil
		}
	case 2:
		if cmd := findCommand(words[0], words[1]); cmd != nil {
			fs := flag.NewFlagSet(cmd.path(), flag.ContinueOnError)
			c.g.register(fs)
			cmd.flags(fs)
			c.commandUsage(cmd, fs)
			return nil
		}
	}
	return usagef("no command %q: see fleetctl help", strings.Join(words, " "))
}

// printFlags prints the flags of fs that keep says to, as --name.
func printFlags(w io.Writer, fs *flag.FlagSet, keep func(string) bool) {
	fs.VisitAll(func(f *flag.Flag) {
		if !keep(f.Name) {
			return
		}
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		if d := f.DefValue; d != "" && d != "false" && d != "0" && !strings.Contains(f.Name, "token") {
			usage += " (default " + d + ")"
		}
		fmt.Fprintf(w, "%s\n    \t%s\n", line, usage)
	})
}
