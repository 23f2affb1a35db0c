package natsauth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/internal/fsutil"
)

// Setup writes what an external NATS cluster and the gateways on it
// need to run the fleet in operator mode, as nsc would make it: an
// operator with a signing key, a system account, the fleet account with
// JetStream and the scoped agent signing key, the gateway's and the
// system user's creds, and a server configuration include.

// SetupFiles names the files Setup writes in its directory.
var SetupFiles = struct {
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
}{
	OperatorKey: "operator.nk", OperatorSigningKey: "operator-signer.nk", SystemAccountKey: "system-account.nk",
	AccountKey: "account.nk", AgentSigningKey: "agent-signer.nk",
	OperatorJWT: "operator.jwt", SystemAccountJWT: "system-account.jwt", AccountJWT: "account.jwt",
	GatewayCreds: "gateway.creds", SystemCreds: "system.creds",
	ServerConfig: "fleet-auth.conf",
}

// SetupResult says what Setup made.
type SetupResult struct {
	Dir                                 string
	Operator, SystemAccount, Account    string // public keys
	AgentSigningKey, OperatorSigningKey string // public keys
}

// Setup writes the setup into dir (created 0700 if need be), agents
// answering calls for up to maxCall (0: 1 h, the gateway's default). It
// refuses to overwrite a setup: a second one would be another fleet.
func Setup(dir string, maxCall time.Duration) (SetupResult, error) {
	if maxCall == 0 {
		maxCall = time.Hour
	}
	f := SetupFiles
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return SetupResult{}, fmt.Errorf("nats-setup: %w", err)
	}
	for _, name := range []string{f.OperatorKey, f.AccountKey, f.ServerConfig, f.GatewayCreds} {
		if _, err := os.Lstat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			return SetupResult{}, fmt.Errorf("nats-setup: %s already holds a setup (%s): it would make another fleet; give an empty directory", dir, name)
		}
	}
	files, res, err := natsSetupFiles(maxCall)
	if err != nil {
		return SetupResult{}, fmt.Errorf("nats-setup: %w", err)
	}
	res.Dir = dir
	for name, content := range files {
		perm := os.FileMode(0o600)
		if strings.HasSuffix(name, ".jwt") || strings.HasSuffix(name, ".conf") {
			perm = 0o644
		}
		if err := fsutil.WriteFileAtomic(filepath.Join(dir, name), content, perm); err != nil {
			return SetupResult{}, fmt.Errorf("nats-setup: %w", err)
		}
	}
	return res, nil
}

// natsSetupFiles generates the keys and returns the files' contents.
func natsSetupFiles(maxCall time.Duration) (map[string][]byte, SetupResult, error) {
	var kp [7]nkeys.KeyPair // operator, its signer, system, fleet, agent signer, gateway user, system user
	prefixes := []nkeys.PrefixByte{nkeys.PrefixByteOperator, nkeys.PrefixByteOperator, nkeys.PrefixByteAccount,
		nkeys.PrefixByteAccount, nkeys.PrefixByteAccount, nkeys.PrefixByteUser, nkeys.PrefixByteUser}
	for i, p := range prefixes {
		var err error
		if kp[i], err = nkeys.CreatePair(p); err != nil {
			return nil, SetupResult{}, err
		}
	}
	op, opSigner, sys, acct, agentSigner, gwUser, sysUser := kp[0], kp[1], kp[2], kp[3], kp[4], kp[5], kp[6]
	res := SetupResult{Operator: publicKey(op), SystemAccount: publicKey(sys), Account: publicKey(acct),
		AgentSigningKey: publicKey(agentSigner), OperatorSigningKey: publicKey(opSigner)}

	oc := jwt.NewOperatorClaims(res.Operator)
	oc.Name = operatorName
	oc.SystemAccount = res.SystemAccount
	oc.SigningKeys.Add(res.OperatorSigningKey)
	opJWT, err := oc.Encode(op)
	if err != nil {
		return nil, res, fmt.Errorf("operator JWT: %w", err)
	}
	sc := jwt.NewAccountClaims(res.SystemAccount)
	sc.Name = systemAccountName
	sysJWT, err := sc.Encode(opSigner)
	if err != nil {
		return nil, res, fmt.Errorf("system account JWT: %w", err)
	}
	acctJWT, err := fleetAccountClaims(res.Account, res.AgentSigningKey, maxCall).Encode(opSigner)
	if err != nil {
		return nil, res, fmt.Errorf("fleet account JWT: %w", err)
	}
	gwCreds, err := credsFile(gwUser, "fleet-gateway", acct, runtimeDenied()...)
	if err != nil {
		return nil, res, err
	}
	sysCreds, err := credsFile(sysUser, "fleet-gateway system", sys, systemDenied()...)
	if err != nil {
		return nil, res, err
	}
	seed := func(k nkeys.KeyPair) []byte { s, _ := k.Seed(); return append(s, '\n') }
	f := SetupFiles
	return map[string][]byte{
		f.OperatorKey: seed(op), f.OperatorSigningKey: seed(opSigner), f.SystemAccountKey: seed(sys),
		f.AccountKey: seed(acct), f.AgentSigningKey: seed(agentSigner),
		f.OperatorJWT: []byte(opJWT + "\n"), f.SystemAccountJWT: []byte(sysJWT + "\n"), f.AccountJWT: []byte(acctJWT + "\n"),
		f.GatewayCreds: gwCreds, f.SystemCreds: sysCreds,
		f.ServerConfig: serverConfig(opJWT, res, sysJWT, acctJWT),
	}, res, nil
}

// credsFile issues a user of the account whose key is account, that may
// publish anything but deny, and returns its creds file.
func credsFile(user nkeys.KeyPair, name string, account nkeys.KeyPair, deny ...string) ([]byte, error) {
	token, err := userJWT(user, name, account, "", deny...)
	if err != nil {
		return nil, fmt.Errorf("%s user JWT: %w", name, err)
	}
	seed, _ := user.Seed()
	return jwt.FormatUserConfig(token, seed)
}

// serverConfig is the include every server of the cluster loads.
func serverConfig(opJWT string, res SetupResult, sysJWT, acctJWT string) []byte {
	return []byte(fmt.Sprintf(`# fleetmcp: operator mode for the fleet. Generated by fleet-gateway nats-setup;
# include it from every server's configuration ("include fleet-auth.conf").
#
# The fleet account (FLEET, %[4]s) holds the gateways and the agents; its
# scoped signing key %[5]s issues one user per agent, limited to that host's
# subjects. The gateways push account updates (revocations) through the
# system account; the full resolver keeps them on disk and shares them with
# every server of the cluster.
operator: "%[1]s"
system_account: %[2]s
resolver: {
  type: full
  # Relative to the server's working directory; give each server its own.
  dir: "./fleet-jwt"
  allow_delete: false
  interval: "2m"
  timeout: "5s"
}
resolver_preload: {
  %[2]s: "%[3]s"
  %[4]s: "%[6]s"
}
`, opJWT, res.SystemAccount, sysJWT, res.Account, res.AgentSigningKey, acctJWT))
}
