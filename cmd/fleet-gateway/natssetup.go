package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway"
)

// runNATSSetup is `fleet-gateway nats-setup --out DIR`: it writes the
// operator-mode setup of an external NATS cluster (what nsc would make)
// and says what goes where.
func runNATSSetup(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleet-gateway nats-setup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "directory to write the setup to (created 0700; must not hold a setup already)")
	maxCall := fs.Duration("max_call_duration", time.Hour, "how long agents may answer one call (the gateways' longest call)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fleet-gateway nats-setup --out DIR\n\nWrites the operator, accounts, keys and creds an external NATS cluster runs the fleet with, and the configuration include for its servers.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("nats-setup: unexpected argument %q: all options are flags", fs.Arg(0))
	}
	if *out == "" {
		return errors.New("nats-setup: --out DIR is required")
	}
	if *maxCall < time.Second {
		return fmt.Errorf("nats-setup: --max_call_duration %s is too short", *maxCall)
	}
	res, err := gateway.NATSSetup(*out, *maxCall)
	if err != nil {
		return err
	}
	f := gateway.NATSSetupFiles
	p := func(name string) string { return filepath.Join(res.Dir, name) }
	fmt.Fprintf(stdout, `NATS operator-mode setup written to %s

  operator        %s (signing key %s)
  system account  %s
  fleet account   %s (agent signing key %s)

Every NATS server of the cluster: copy %s next to its configuration,
add "include %s" to it, and give each server its own resolver dir.

Every gateway replica:
  fleet-gateway --nats_url nats://n1:4222,... \
    --nats_creds %s \
    --nats_system_creds %s \
    --nats_agent_signing_key %s \
    --nats_operator_signing_key %s \
    --signing_key %s

The gateways sign every call with the key in %s: copy
that whole directory to every replica (its rotations keep their files
there: fleet-gateway signing-key rotate|retire --signing_key FILE).

Keep %s, %s and %s offline: they can make any account or user.
`, res.Dir, res.Operator, res.OperatorSigningKey, res.SystemAccount, res.Account, res.AgentSigningKey,
		p(f.ServerConfig), f.ServerConfig, p(f.GatewayCreds), p(f.SystemCreds), p(f.AgentSigningKey), p(f.OperatorSigningKey),
		p(f.SigningKey), filepath.Dir(p(f.SigningKey)),
		p(f.OperatorKey), p(f.SystemAccountKey), p(f.AccountKey))
	return nil
}

// runReplicaSeed is `fleet-gateway replica-seed --data_dir DIR --out DIR`:
// it writes the keys another gateway of the same embedded cluster starts
// from (gateway.SeedReplica) and says how to start it.
func runReplicaSeed(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleet-gateway replica-seed", flag.ContinueOnError)
	fs.SetOutput(stderr)
	from := fs.String("data_dir", defaultDataDir(getenv), "data directory of a gateway of the fleet (started once, so that its keys exist; it may be running)")
	out := fs.String("out", "", "directory to write the seed to: the new gateway's --data_dir (must not exist or be empty)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fleet-gateway replica-seed --data_dir DIR --out DIR\n\nWrites the fleet's keys (NATS operator and accounts, fleet CA, signing key) for another gateway of an embedded cluster.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("replica-seed: unexpected argument %q: all options are flags", fs.Arg(0))
	}
	if *out == "" {
		return errors.New("replica-seed: --out DIR is required")
	}
	files, err := gateway.SeedReplica(*from, *out)
	if err != nil {
		return fmt.Errorf("replica-seed: %w", err)
	}
	fmt.Fprintf(stdout, "Seed of a gateway replica written to %s:\n", *out)
	for _, f := range files {
		fmt.Fprintf(stdout, "  %s\n", f)
	}
	fmt.Fprintf(stdout, `
It holds the keys of the whole fleet: move it as you would a CA key (scp -r,
owned by the gateway's user, mode 0700), make it the new gateway's
--data_dir, and start that gateway with the same --nats_cluster and
--nats_routes as the others and a --name of its own.
`)
	return nil
}
