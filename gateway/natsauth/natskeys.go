package natsauth

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/gateway/internal/fsutil"
)

// The embedded NATS server runs in operator mode with keys the gateway
// generates on first start and keeps in DataDir/nats (mode 0700, each
// seed 0600): the operator, and scoped signing keys of the fleet and
// system accounts whose templates fix what the users they sign may do
// (the gateway's own users, enrol credentials, agents, the gateway's
// system users). The accounts' own keys are never kept: only their
// public keys are (account.pub, system.pub). Whoever reads the data
// directory can thus mint users of those templates only, none of which
// may delete, cut or reconfigure the audit trail or the buckets a
// revocation and a spent token live in (README, security model). Losing
// the keys means a new fleet identity: every agent must enrol again.

const (
	natsDir              = "nats"
	operatorKeyFile      = "operator.nk"
	agentSignerKeyFile   = "agent-signer.nk"
	gatewaySignerKeyFile = "gateway-signer.nk"
	enrolSignerKeyFile   = "enrol-signer.nk"
	systemSignerKeyFile  = "system-signer.nk"
	accountPubFile       = "account.pub"
	systemPubFile        = "system.pub"
	// accountJWTFile is the last fleet account JWT the gateway pushed:
	// the embedded server is started with it, so that a restart never
	// forgets a revocation.
	accountJWTFile = "account.jwt"

	// The accounts' own keys, which gateways before scoped signing keys
	// kept: read once to derive the signing keys from, then removed.
	legacyAccountKeyFile = "account.nk"
	legacySystemKeyFile  = "system.nk"
)

// natsKeys are the embedded server's keys.
type natsKeys struct {
	operator   nkeys.KeyPair
	accountPub string // the fleet account
	systemPub  string // the system account
	// agentSigner signs agents' credentials, gatewaySigner the gateway's
	// own users, enrolSigner the enrol credentials of NATS join tokens
	// (all scoped keys of the fleet account); systemSigner the gateway's
	// system users (a scoped key of the system account).
	agentSigner   nkeys.KeyPair
	gatewaySigner nkeys.KeyPair
	enrolSigner   nkeys.KeyPair
	systemSigner  nkeys.KeyPair
}

// keyFiles lists the seed files in DataDir/nats with their kinds.
var keyFiles = []struct {
	name   string
	prefix nkeys.PrefixByte
	what   string
}{
	{operatorKeyFile, nkeys.PrefixByteOperator, "operator"},
	{agentSignerKeyFile, nkeys.PrefixByteAccount, "agent signing key"},
	{gatewaySignerKeyFile, nkeys.PrefixByteAccount, "gateway signing key"},
	{enrolSignerKeyFile, nkeys.PrefixByteAccount, "enrol signing key"},
	{systemSignerKeyFile, nkeys.PrefixByteAccount, "system signing key"},
}

// accountKeys are, for each account, the file of its public key, the
// file its seed was kept in before, and its scoped signing keys that
// are derived from that seed when it is met (so that the nodes of a
// cluster, seeded with the same account key, derive the same ones).
var accountKeys = []struct {
	pubFile, legacyFile, what string
	signers                   []string
}{
	{accountPubFile, legacyAccountKeyFile, "fleet account", []string{gatewaySignerKeyFile, enrolSignerKeyFile}},
	{systemPubFile, legacySystemKeyFile, "system account", []string{systemSignerKeyFile}},
}

// loadOrCreateNATSKeys reads the keys in dataDir/nats, generating those
// that do not exist yet, and moves a data directory that still holds
// the accounts' own keys to scoped signing keys (log says so). The
// caller holds the data directory's lock.
func loadOrCreateNATSKeys(dataDir string, log *slog.Logger) (*natsKeys, error) {
	dir := filepath.Join(dataDir, natsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("NATS keys: %w", err)
	}
	pubs := make([]string, len(accountKeys))
	for i, a := range accountKeys {
		pub, err := loadOrMakeAccount(dir, a.pubFile, a.legacyFile, a.what, a.signers, log)
		if err != nil {
			return nil, err
		}
		pubs[i] = pub
	}
	kps := make([]nkeys.KeyPair, len(keyFiles))
	for i, f := range keyFiles {
		kp, err := loadOrCreateKey(filepath.Join(dir, f.name), f.prefix, f.what)
		if err != nil {
			return nil, err
		}
		kps[i] = kp
	}
	return &natsKeys{operator: kps[0], agentSigner: kps[1], gatewaySigner: kps[2], enrolSigner: kps[3], systemSigner: kps[4],
		accountPub: pubs[0], systemPub: pubs[1]}, nil
}

// loadOrMakeAccount returns the public key of an account kept in
// dir/pubFile. When there is none, it takes the account's seed from
// dir/legacyFile (a data directory from before scoped signing keys) or
// makes one, derives from it the signing keys named that do not exist
// yet, writes the public key and removes the seed, which nothing needs
// from then on: the account's JWT is signed by the operator.
func loadOrMakeAccount(dir, pubFile, legacyFile, what string, signers []string, log *slog.Logger) (string, error) {
	pubPath, legacyPath := filepath.Join(dir, pubFile), filepath.Join(dir, legacyFile)
	pub, err := readPubFile(pubPath, what)
	if err == nil {
		// A seed left by a move cut short is removed, if it is this
		// account's.
		if kp, err := readSeedFile(legacyPath, nkeys.PrefixByteAccount, what); err == nil {
			if publicKey(kp) != pub {
				return "", fmt.Errorf("%s holds the key of account %s, but %s says the %s is %s: remove the file that is wrong (the account JWT in %s names the fleet account)",
					legacyPath, publicKey(kp), pubPath, what, pub, accountJWTFile)
			}
			if err := os.Remove(legacyPath); err != nil {
				return "", fmt.Errorf("remove the %s key: %w", what, err)
			}
		}
		return pub, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	acct, err := readSeedFile(legacyPath, nkeys.PrefixByteAccount, what)
	legacy := err == nil
	switch {
	case errors.Is(err, os.ErrNotExist):
		if acct, err = nkeys.CreateAccount(); err != nil {
			return "", fmt.Errorf("generate the %s key: %w", what, err)
		}
	case err != nil:
		return "", err
	}
	for _, name := range signers {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err == nil {
			continue
		}
		kp, err := deriveSigner(acct, name)
		if err != nil {
			return "", err
		}
		seed, _ := kp.Seed()
		if err := fsutil.WriteFileAtomic(path, append(seed, '\n'), 0o600); err != nil {
			return "", fmt.Errorf("store the %s: %w", name, err)
		}
	}
	pub = publicKey(acct)
	if err := fsutil.WriteFileAtomic(pubPath, []byte(pub+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("store the %s's public key: %w", what, err)
	}
	if legacy {
		if err := os.Remove(legacyPath); err != nil {
			return "", fmt.Errorf("remove the %s key: %w", what, err)
		}
		log.Warn("the "+what+"'s key is no longer kept: the gateway now signs its users with scoped signing keys derived from it, which cannot reach the audit trail; "+
			"seed other cluster nodes again only if they do not start (they derive the same keys)", "removed", legacyPath, "signing_keys", strings.Join(signers, ","))
	}
	return pub, nil
}

// deriveSigner derives the signing key stored as name from an
// account's seed.
func deriveSigner(acct nkeys.KeyPair, name string) (nkeys.KeyPair, error) {
	seed, err := acct.Seed()
	if err != nil {
		return nil, err
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, err
	}
	derived, err := hkdf.Key(sha256.New, raw, nil, "fleetmcp nats "+name, 32)
	if err != nil {
		return nil, err
	}
	return nkeys.FromRawSeed(nkeys.PrefixByteAccount, derived)
}

// readPubFile reads an account's public key from path; its error wraps
// os.ErrNotExist when there is no such file.
func readPubFile(path, what string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the %s's public key: %w", what, err)
	}
	pub := string(bytes.TrimSpace(data))
	if !nkeys.IsValidPublicAccountKey(pub) {
		return "", fmt.Errorf("%s should hold the public key of the %s (A..., 56 characters), not %.60q: put back the file from a backup or another node's data directory", path, what, pub)
	}
	return pub, nil
}

// loadOrCreateKey reads the seed in path, which must be of kind prefix;
// when there is no such file it generates one.
func loadOrCreateKey(path string, prefix nkeys.PrefixByte, what string) (nkeys.KeyPair, error) {
	kp, err := readSeedFile(path, prefix, what)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return kp, err
	}
	if kp, err = nkeys.CreatePair(prefix); err != nil {
		return nil, fmt.Errorf("generate the %s key: %w", what, err)
	}
	seed, _ := kp.Seed()
	if err := fsutil.WriteFileAtomic(path, append(seed, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("store the %s key: %w", what, err)
	}
	return kp, nil
}

// readSeedFile reads an nkey seed of kind prefix from path: a bare seed,
// as nsc keeps them, or a decorated one (a creds file). Its error wraps
// os.ErrNotExist when the file does not exist.
func readSeedFile(path string, prefix nkeys.PrefixByte, what string) (nkeys.KeyPair, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the %s key: %w", what, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, fmt.Errorf("%s holds the %s key and is readable by others (mode %v); make it 0600: %w", path, what, fi.Mode().Perm(), err)
		}
	}
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return nil, fmt.Errorf("%s does not hold an nkey seed (%w): it should hold the %s key", path, err, what)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("%s holds a public key only: the %s key needs its seed", path, what)
	}
	if got, _, err := nkeys.DecodeSeed(seed); err != nil || got != prefix {
		return nil, fmt.Errorf("%s holds %s, not the %s key (%s)", path, seedKind(got), what, seedKind(prefix))
	}
	return kp, nil
}

// seedKind names the kind of seed of a key kind.
func seedKind(p nkeys.PrefixByte) string {
	switch p {
	case nkeys.PrefixByteOperator:
		return "an operator seed (SO...)"
	case nkeys.PrefixByteAccount:
		return "an account seed (SA...)"
	case nkeys.PrefixByteUser:
		return "a user seed (SU...)"
	}
	return "a seed of another kind"
}

// publicKey returns kp's public key; kp always has one.
func publicKey(kp nkeys.KeyPair) string {
	pub, err := kp.PublicKey()
	if err != nil {
		panic("nkey without a public key: " + err.Error())
	}
	return pub
}

// KeysDir is the NATS keys' directory in the data directory.
const KeysDir = natsDir

// KeyFiles returns the paths of the seeds in dataDir/nats.
func KeyFiles(dataDir string) []string {
	var out []string
	for _, f := range keyFiles {
		out = append(out, filepath.Join(dataDir, natsDir, f.name))
	}
	return out
}

// LegacyKeyFiles returns the paths of the accounts' own keys in a data
// directory not moved to scoped signing keys yet: secrets until the
// start that removes them.
func LegacyKeyFiles(dataDir string) []string {
	return []string{filepath.Join(dataDir, natsDir, legacyAccountKeyFile), filepath.Join(dataDir, natsDir, legacySystemKeyFile)}
}

// SeedFile is a file of a data directory that a replica's seed holds:
// its path relative to the data directory and its mode; an optional one
// may be missing.
type SeedFile struct {
	Path     string
	Mode     os.FileMode
	Optional bool
}

// SeedFiles are the files of the NATS keys and the fleet CA a replica's
// seed holds: the gateways of an embedded cluster share them.
var SeedFiles = []SeedFile{
	{filepath.Join(natsDir, operatorKeyFile), 0o600, false},
	{filepath.Join(natsDir, agentSignerKeyFile), 0o600, false},
	{filepath.Join(natsDir, gatewaySignerKeyFile), 0o600, false},
	{filepath.Join(natsDir, enrolSignerKeyFile), 0o600, false},
	{filepath.Join(natsDir, systemSignerKeyFile), 0o600, false},
	{filepath.Join(natsDir, accountPubFile), 0o644, false},
	{filepath.Join(natsDir, systemPubFile), 0o644, false},
	// The revocations as last pushed: the node starts with them.
	{filepath.Join(natsDir, accountJWTFile), 0o600, true},
	{filepath.Join(TLSDir, CACertFile), 0o644, false},
	{filepath.Join(TLSDir, CAKeyFile), 0o600, false},
}

// CheckSeedSource checks that dataDir holds the NATS keys and the fleet
// CA of a gateway that started once.
func CheckSeedSource(dataDir string) error {
	for _, f := range keyFiles {
		if _, err := readSeedFile(filepath.Join(dataDir, natsDir, f.name), f.prefix, f.what); err != nil {
			return fmt.Errorf("%s is not a gateway's data directory with its NATS keys (start that gateway once first): %w", dataDir, err)
		}
	}
	for _, a := range accountKeys {
		if _, err := readPubFile(filepath.Join(dataDir, natsDir, a.pubFile), a.what); err != nil {
			return fmt.Errorf("%s is not a gateway's data directory with its NATS keys (start that gateway once first): %w", dataDir, err)
		}
	}
	_, err := loadCA(dataDir)
	return err
}
