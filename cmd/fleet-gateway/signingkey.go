package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/signing"
)

// runSigningKey is `fleet-gateway signing-key rotate|retire`: a rotation
// of the gateway's signing key with an overlap (gateway/signing).
func runSigningKey(args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	usage := "usage: fleet-gateway signing-key rotate|retire [--data_dir DIR | --signing_key FILE]\n\n" +
		"rotate makes a new signing key and a key set of it and the current one, signed by both: hosts take it in as they connect (or when a gateway reloads),\n" +
		"and gateways sign each host's calls with the newest key it trusts. retire, once every host trusts the new key (fleetctl agents, or the hosts tool's\n" +
		"trusted keys), adds a key set of the new key alone: hosts then refuse calls signed by the old one. After either, copy the signing directory to every\n" +
		"gateway replica and reload them (kill -HUP)."
	if len(args) == 0 || args[0] != "rotate" && args[0] != "retire" {
		fmt.Fprintln(stderr, usage)
		return errors.New("signing-key: say rotate or retire")
	}
	verb := args[0]
	fs := flag.NewFlagSet("fleet-gateway signing-key "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data_dir", defaultDataDir(getenv), "the gateway's data directory (its key is DATA_DIR/signing/gateway.key)")
	keyFile := fs.String("signing_key", "", "the gateway's --signing_key file (instead of --data_dir)")
	fs.Usage = func() { fmt.Fprintln(stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("signing-key %s: unexpected argument %q: all options are flags", verb, fs.Arg(0))
	}
	path := *keyFile
	switch {
	case path == "" && *dataDir == "":
		return fmt.Errorf("signing-key %s: give --data_dir DIR or --signing_key FILE (the gateway's own)", verb)
	case path == "":
		path = filepath.Join(*dataDir, "signing", "gateway.key")
	}
	do := signing.Rotate
	if verb == "retire" {
		do = signing.Retire
	}
	rep, err := do(path, time.Now())
	if err != nil {
		return fmt.Errorf("signing-key %s: %w", verb, err)
	}
	ids := protocol.KeyIDs(rep.Keys)
	fmt.Fprintf(stdout, "key set %d written to %s: keys %s (the gateway signs with %s)\n\n", rep.Serial, rep.Dir, strings.Join(ids, ", "), ids[0])
	if verb == "rotate" {
		fmt.Fprintf(stdout, "Copy %s to every gateway replica and reload them (kill -HUP, or restart).\n"+
			"Hosts take the new key set in as they connect, or within seconds of a reload; calls keep running meanwhile.\n"+
			"Once every host announces the key %s (the hosts tool's structured output, trusted_keys), run: fleet-gateway signing-key retire\n", rep.Dir, ids[0])
		return nil
	}
	fmt.Fprintf(stdout, "Copy %s to every gateway replica and reload them. Hosts that take the set in refuse calls signed by the old key from then on.\n", rep.Dir)
	return nil
}
