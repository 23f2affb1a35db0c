package main

import (
	"flag"
	"fmt"
	"io"
)

// synopsis is the head of fleet-gateway -h and fleet-gateway help.
const synopsis = `fleet-gateway runs a fleetmcp gateway: the MCP endpoint AI clients connect
to, the fleet API hosts enrol at and fleetctl manages through, and (unless
--nats_url names an external cluster) the embedded NATS server agents dial.

Usage:
  fleet-gateway --dev [flags]             a fleet of one on this machine: caller authentication off,
                                          loopback only, an agent for this machine, fleetctl's profile saved
  fleet-gateway [flags]                   serve (caller authentication: --jwt_issuer or --api_tokens)
  fleet-gateway --new_api_token NAME [--admin]
                                          print a new API token and its --api_tokens entry (--admin: an
                                          admin's, with the fleetctl login command), then exit
  fleet-gateway nats-setup --out DIR      write what an external NATS cluster runs the fleet with
  fleet-gateway signing-key rotate|retire rotate the gateway's signing key, or retire the old one
  fleet-gateway replica-seed --data_dir DIR --out DIR
                                          the fleet's keys for another gateway of an embedded cluster
  fleet-gateway help                      this text
  fleet-gateway --version                 the version, commit, build date and Go version

"fleet-gateway COMMAND -h" describes a command. Settings come from flags, a --config
YAML file, and the environment variables named below.

Flags:
`

// printUsage writes the synopsis and fs's flags to w.
func printUsage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, synopsis)
	out := fs.Output()
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(out)
}
