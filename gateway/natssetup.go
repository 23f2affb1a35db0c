package gateway

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
)

// NATSSetup writes what an external NATS cluster and the gateways on it
// need to run the fleet in operator mode (natsauth.Setup), and the
// gateways' signing key.

// NATSSetupFiles names the files NATSSetup writes in its directory: those
// of natsauth.SetupFiles, and the signing key.
var NATSSetupFiles = struct {
	// Seeds: keep OperatorKey, SystemAccountKey and AccountKey offline
	// (they can make any account or user); OperatorSigningKey and
	// AgentSigningKey go to the gateways.
	OperatorKey, OperatorSigningKey, SystemAccountKey, AccountKey, AgentSigningKey string
	// JWTs of the operator and the two accounts (also in ServerConfig).
	OperatorJWT, SystemAccountJWT, AccountJWT string
	// Creds of the gateway's user and of the system user.
	GatewayCreds, SystemCreds string
	// ServerConfig is the include for every server of the cluster.
	ServerConfig string
	// SigningKey is the gateways' signing key (--signing_key), in a
	// directory of its own where its rotations keep their files.
	SigningKey string
}{
	OperatorKey: natsauth.SetupFiles.OperatorKey, OperatorSigningKey: natsauth.SetupFiles.OperatorSigningKey,
	SystemAccountKey: natsauth.SetupFiles.SystemAccountKey, AccountKey: natsauth.SetupFiles.AccountKey,
	AgentSigningKey: natsauth.SetupFiles.AgentSigningKey, OperatorJWT: natsauth.SetupFiles.OperatorJWT,
	SystemAccountJWT: natsauth.SetupFiles.SystemAccountJWT, AccountJWT: natsauth.SetupFiles.AccountJWT,
	GatewayCreds: natsauth.SetupFiles.GatewayCreds, SystemCreds: natsauth.SetupFiles.SystemCreds,
	ServerConfig: natsauth.SetupFiles.ServerConfig,
	SigningKey:   filepath.Join(signing.Dir, signing.KeyFile),
}

// NATSSetupResult says what NATSSetup made.
type NATSSetupResult = natsauth.SetupResult

// NATSSetup writes the setup into dir (created 0700 if need be), agents
// answering calls for up to maxCall (0: 1 h, the gateway's default),
// and the gateways' signing key. It refuses to overwrite a setup: a
// second one would be another fleet.
func NATSSetup(dir string, maxCall time.Duration) (NATSSetupResult, error) {
	res, err := natsauth.Setup(dir, maxCall)
	if err != nil {
		return res, err
	}
	if _, err := signing.Create(filepath.Join(dir, NATSSetupFiles.SigningKey)); err != nil {
		return NATSSetupResult{}, fmt.Errorf("nats-setup: %w", err)
	}
	return res, nil
}
