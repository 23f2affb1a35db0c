package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"
)

// The embedded NATS server runs in operator mode with keys the gateway
// generates on first start and keeps in DataDir/nats (mode 0700, each
// seed 0600): the operator, the system account, the fleet account, and
// the fleet account's scoped signing key that issues agent credentials.
// Losing them means a new fleet identity: every agent must enrol again.

const (
	natsDir            = "nats"
	operatorKeyFile    = "operator.nk"
	systemKeyFile      = "system.nk"
	accountKeyFile     = "account.nk"
	agentSignerKeyFile = "agent-signer.nk"
	// accountJWTFile is the last fleet account JWT the gateway pushed:
	// the embedded server is started with it, so that a restart never
	// forgets a revocation.
	accountJWTFile = "account.jwt"
)

// natsKeys are the embedded server's signing keys.
type natsKeys struct {
	operator    nkeys.KeyPair
	system      nkeys.KeyPair
	account     nkeys.KeyPair
	agentSigner nkeys.KeyPair
}

// keyFiles lists the key files in DataDir/nats with their kinds.
var keyFiles = []struct {
	name   string
	prefix nkeys.PrefixByte
	what   string
}{
	{operatorKeyFile, nkeys.PrefixByteOperator, "operator"},
	{systemKeyFile, nkeys.PrefixByteAccount, "system account"},
	{accountKeyFile, nkeys.PrefixByteAccount, "fleet account"},
	{agentSignerKeyFile, nkeys.PrefixByteAccount, "agent signing key"},
}

// loadOrCreateNATSKeys reads the keys in dataDir/nats, generating those
// that do not exist yet. The caller holds the data directory's lock.
func loadOrCreateNATSKeys(dataDir string) (*natsKeys, error) {
	dir := filepath.Join(dataDir, natsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("NATS keys: %w", err)
	}
	kps := make([]nkeys.KeyPair, len(keyFiles))
	for i, f := range keyFiles {
		kp, err := loadOrCreateKey(filepath.Join(dir, f.name), f.prefix, f.what)
		if err != nil {
			return nil, err
		}
		kps[i] = kp
	}
	return &natsKeys{operator: kps[0], system: kps[1], account: kps[2], agentSigner: kps[3]}, nil
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
	if err := writeFileAtomic(path, append(seed, '\n'), 0o600); err != nil {
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
