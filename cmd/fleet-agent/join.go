package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/agent/statelock"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// joinFlags are how join and install enrol the machine.
type joinFlags struct {
	gateway, token, tokenFile, caPin *string
	// stdin is where --token_file - reads the token; prompt where it
	// asks for it when stdin is a terminal.
	stdin  io.Reader
	prompt io.Writer
}

func addJoinFlags(fs *flag.FlagSet, getenv func(string) string) *joinFlags {
	return &joinFlags{
		gateway:   fs.String("gateway", getenv("FLEET_GATEWAY"), "the gateway's fleet API, https://HOST:8443 (env FLEET_GATEWAY)"),
		token:     fs.String("token", "", "the join token from fleetctl token create (visible to ps: prefer --token_file or env FLEET_JOIN_TOKEN); a NATS join token (token create --nats) enrols over NATS at --nats"),
		tokenFile: fs.String("token_file", "", `a file holding the join token; "-" reads it from standard input (asked for on a terminal)`),
		caPin:     fs.String("ca_pin", getenv("FLEET_CA_PIN"), "the pin of the fleet's CA, sha256:... as fleetctl token create prints it (env FLEET_CA_PIN)"),
		stdin:     tokenStdin,
		prompt:    fs.Output(),
	}
}

// tokenStdin is where --token_file - reads (tests replace it).
var tokenStdin io.Reader = os.Stdin

// maxTokenFileBytes bounds a token file (a token is about 60 bytes, a
// NATS join token about 2 KiB).
const maxTokenFileBytes = 8 << 10

// options returns the join's options for the agent of stateDir asking for
// host (empty: the token's). The token comes from --token, --token_file
// or FLEET_JOIN_TOKEN, exactly one. A NATS join token (fleetctl token
// create --nats) enrols over NATS at the first of natsURLs (--nats).
func (j *joinFlags) options(getenv func(string) string, host, stateDir, natsURLs string) (identity.JoinOptions, error) {
	o := identity.JoinOptions{GatewayURL: *j.gateway, CAPin: strings.TrimSpace(*j.caPin), Host: host, StateDir: stateDir}
	env := getenv("FLEET_JOIN_TOKEN")
	given := 0
	for _, s := range []string{*j.token, *j.tokenFile} {
		if s != "" {
			given++
		}
	}
	switch {
	case given > 1:
		return o, errors.New("--token and --token_file both given: pass the join token once")
	case *j.tokenFile == "-":
		tok, err := readTokenLine(j.stdin, j.prompt)
		if err != nil {
			return o, err
		}
		o.Token = tok
	case *j.tokenFile != "":
		f, err := os.Open(*j.tokenFile)
		if err != nil {
			return o, fmt.Errorf("--token_file: %w", err)
		}
		defer f.Close()
		data, err := io.ReadAll(io.LimitReader(f, maxTokenFileBytes+1))
		if err != nil {
			return o, fmt.Errorf("--token_file: %w", err)
		}
		if len(data) > maxTokenFileBytes {
			return o, fmt.Errorf("--token_file %s: more than %d bytes, not a join token", *j.tokenFile, maxTokenFileBytes)
		}
		o.Token = strings.TrimSpace(string(data))
	case *j.token != "":
		o.Token = *j.token
	default:
		o.Token = strings.TrimSpace(env)
	}
	if o.Token == "" {
		return o, errors.New("no join token: pass --token_file FILE, set FLEET_JOIN_TOKEN, or pass --token (get one with fleetctl token create)")
	}
	if protocol.IsNATSJoinToken(o.Token) && *j.gateway == "" {
		urls := splitList(natsURLs)
		if len(urls) == 0 {
			return o, errors.New("no NATS URL: a NATS join token enrols over NATS; pass --nats tls://GATEWAY:4222 as fleetctl token create --nats prints it")
		}
		o.NATSURL = urls[0]
	} else if *j.gateway == "" {
		return o, errors.New("no gateway: pass --gateway https://GATEWAY:8443 (or set FLEET_GATEWAY)")
	}
	if o.CAPin == "" {
		return o, errors.New("no CA pin: pass --ca_pin sha256:... as fleetctl token create prints it (or set FLEET_CA_PIN); it is what makes the gateway trusted")
	}
	return o, identity.CheckJoinOptions(&o)
}

// readTokenLine reads a join token from the first line of r (standard
// input), asking for it on prompt when r is a terminal.
func readTokenLine(r io.Reader, prompt io.Writer) (string, error) {
	if f, ok := r.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 && prompt != nil {
			fmt.Fprint(prompt, "Join token (paste it, then press Enter): ")
		}
	}
	line, err := bufio.NewReader(io.LimitReader(r, maxTokenFileBytes+1)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("--token_file -: reading standard input: %w", err)
	}
	if len(line) > maxTokenFileBytes {
		return "", fmt.Errorf("--token_file -: more than %d bytes on standard input, not a join token", maxTokenFileBytes)
	}
	tok := strings.TrimSpace(line)
	if tok == "" {
		return "", errors.New("--token_file -: no join token on standard input: paste the token fleetctl token create printed (or pipe it in)")
	}
	return tok, nil
}

// runJoin enrols the machine with the gateway (or finds it enrolled with
// it already), then runs the agent as a plain start does.
func runJoin(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleet-agent join", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, joinSynopsis)
	jf := addJoinFlags(fs, getenv)
	rf := addRunFlags(fs, getenv)
	if _, err := parse(fs, args); err != nil {
		return err
	}
	rf.watchConfig(fs, args, func(fs *flag.FlagSet) {
		addJoinFlags(fs, getenv)
		addRunFlags(fs, getenv)
	})
	log, err := rf.logger(stderr)
	if err != nil {
		return err
	}
	opts, err := jf.options(getenv, *rf.name, *rf.stateDir, *rf.servers)
	if err != nil {
		return err
	}
	if err := checkPolicyFirst(rf, getenv); err != nil {
		return err
	}
	if err := checkStateModes(*rf.stateDir); err != nil {
		return err
	}
	// The state directory is this process's from before the key is made
	// until the agent it runs stops: a second join or agent on it is
	// refused, and never leaves a key of one and a credential of another.
	lock, err := statelock.Acquire(*rf.stateDir)
	if err != nil {
		return err
	}
	opts.Lock = lock
	opts.Say = func(msg string) { log.Warn(msg) }
	id, enrolled, err := identity.Join(ctx, opts)
	if err != nil {
		lock.Release()
		return err
	}
	if enrolled {
		log.Info("enrolled", "host", id.Enrolment.Host, "gateway", id.Enrolment.GatewayURL, "nats", opts.NATSURL, "labels", id.Enrolment.Labels,
			"expires", id.Enrolment.Expires, "state_dir", *rf.stateDir)
	} else {
		log.Info("enrolled already with this gateway: the token was not used", "host", id.Enrolment.Host, "gateway", id.Enrolment.GatewayURL)
	}
	if err := checkNATSReach(ctx, id, *rf.servers, *rf.stateDir); err != nil {
		lock.Release()
		return err
	}
	return start(ctx, rf, id, lock, getenv, log)
}

// checkNATSReach makes sure this host can use one of the NATS URLs it
// will dial (--nats, else those of the enrolment): a TCP connection and a
// TLS handshake against the fleet's NATS CA. When none works it asks the
// gateway for the current ones once (they may have been fixed since),
// and otherwise says which URL failed, why, and what to run on the
// gateway. The enrolment is kept either way: the token was well spent.
func checkNATSReach(ctx context.Context, id *identity.Identity, servers, stateDir string) error {
	urls := splitList(servers)
	given := len(urls) > 0
	if !given {
		urls = id.Enrolment.NATSURLs
	}
	err := identity.ProbeNATS(ctx, urls, id.Enrolment.NATSCA)
	if err == nil {
		return nil
	}
	if !given && id.Enrolment.GatewayURL != "" {
		if now, changed, lerr := id.Locate(ctx); lerr == nil && changed {
			if identity.ProbeNATS(ctx, now, id.Enrolment.NATSCA) == nil {
				return nil
			}
			urls = now
		}
	}
	if given {
		return fmt.Errorf("host %s is enrolled (its identity is in %s), but no NATS URL of --nats works from here:\n  %s\ncheck --nats, or drop it to dial the URLs the gateway gave (%s)",
			id.Enrolment.Host, stateDir, indent(err), strings.Join(id.Enrolment.NATSURLs, ","))
	}
	fix := "restart fleet-gateway with --advertise NAME, a name or address this host reaches the gateway by (or --nats_advertise tls://NAME:PORT)"
	if u, perr := url.Parse(id.Enrolment.GatewayURL); perr == nil && u.Hostname() != "" {
		fix = fmt.Sprintf("restart fleet-gateway with --advertise %s (the name this host reached its fleet API by), or --nats_advertise tls://%s:PORT", u.Hostname(), u.Hostname())
	}
	return fmt.Errorf("host %s is enrolled (its identity is in %s), but no NATS URL the gateway gave (%s) works from here:\n  %s\n"+
		"On the gateway: %s. Then start the agent again (fleet-agent --state_dir %s, or its service): it asks the gateway for the current NATS URLs by itself, no token needed",
		id.Enrolment.Host, stateDir, strings.Join(urls, ","), indent(err), fix, stateDir)
}

// indent puts each line of err's text after the first on a line of its
// own, indented.
func indent(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "\n  ")
}

// checkPolicyFirst reads the host policy the agent will run with before
// the machine enrols: a policy the agent would refuse must not cost the
// token's use and the host's name.
func checkPolicyFirst(rf *runFlags, getenv func(string) string) error {
	self, _ := os.Executable()
	_, err := agent.CheckPolicy(agent.Config{PolicyFile: *rf.policy, Cwd: *rf.cwd, Shell: *rf.shell,
		Home: cmp.Or(getenv("HOME"), getenv("USERPROFILE")), GitGuard: self})
	if err != nil {
		return fmt.Errorf("host policy %s: %w (nothing was enrolled: fix the policy, then join again)", *rf.policy, err)
	}
	return nil
}
