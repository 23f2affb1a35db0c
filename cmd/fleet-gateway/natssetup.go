package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
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
    --nats_creds %[9]s \
    --nats_system_creds %[10]s \
    --nats_agent_signing_key %[11]s \
    --signing_key %[13]s

One revoker, on a machine of the NATS servers rather than a gateway's (it
alone holds the operator signing key, which can re-sign any account; the
gateways ask it to revoke hosts, and it revokes nothing the gateways have
not recorded):
  fleet-gateway nats-revoker --nats_url nats://n1:4222,... \
    --nats_creds %[9]s \
    --nats_system_creds %[10]s \
    --nats_agent_signing_key %[11]s \
    --nats_operator_signing_key %[12]s

The gateways sign every call with the key in %[14]s: copy
that whole directory to every replica (its rotations keep their files
there: fleet-gateway signing-key rotate|retire --signing_key FILE).

Keep %[15]s, %[16]s and %[17]s offline: they can make any account or user.
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

// runNATSRevoker is `fleet-gateway nats-revoker`: the revoker of an
// external cluster (natsauth.RunRevoker), until SIGINT or SIGTERM.
func runNATSRevoker(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("fleet-gateway nats-revoker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg natsauth.RevokerConfig
	urls := fs.String("nats_url", "", "the cluster's NATS URLs, comma-separated")
	fs.StringVar(&cfg.CredsFile, "nats_creds", "", "creds of a fleet account user (the gateways' gateway.creds)")
	fs.StringVar(&cfg.SystemCredsFile, "nats_system_creds", "", "creds of a system account user (system.creds)")
	fs.StringVar(&cfg.AgentSigningKeyFile, "nats_agent_signing_key", "", "the agent signing key's seed (the seal of the revoked keys' ledger is derived from it)")
	fs.StringVar(&cfg.OperatorSigningKeyFile, "nats_operator_signing_key", "", "the operator signing key's seed: only the revoker holds it")
	fs.StringVar(&cfg.CAFile, "nats_ca", "", "the cluster's TLS CA (PEM), when the system's roots do not know it")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fleet-gateway nats-revoker --nats_url URLS --nats_creds F --nats_system_creds F --nats_agent_signing_key F --nats_operator_signing_key F\n\n"+
			"Adds the keys the gateways revoke to the fleet account's revocations on an external NATS cluster, holding its operator signing key so that no gateway does.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("nats-revoker: unexpected argument %q: all options are flags", fs.Arg(0))
	}
	var missing []string
	for flagName, v := range map[string]string{"--nats_url": *urls, "--nats_creds": cfg.CredsFile, "--nats_system_creds": cfg.SystemCredsFile,
		"--nats_agent_signing_key": cfg.AgentSigningKeyFile, "--nats_operator_signing_key": cfg.OperatorSigningKeyFile} {
		if v == "" {
			missing = append(missing, flagName)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("nats-revoker needs %s (fleet-gateway nats-setup wrote the files)", strings.Join(missing, ", "))
	}
	cfg.NATSURLs = strings.Split(*urls, ",")
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	return natsauth.RunRevoker(ctx, cfg)
}
