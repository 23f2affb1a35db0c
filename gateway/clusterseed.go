package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
)

// The gateways of an embedded cluster are one fleet: the same operator
// and accounts (agents' credentials are valid on every node, a
// revocation pushed by any gateway holds on all), the same fleet CA
// (agents pinned it, and routes trust only its certificates) and the same
// signing key (agents trust skill manifests signed with it). A second or
// third gateway starts from a data directory seeded from the first one's:
// those keys and nothing else. Its JetStream store is its own; the
// cluster fills it.

// seedFiles are the files of a data directory a replica's seed holds,
// with their modes; optional ones may be missing.
var seedFiles = []struct {
	path     string
	mode     os.FileMode
	optional bool
}{
	{filepath.Join(natsDir, operatorKeyFile), 0o600, false},
	{filepath.Join(natsDir, agentSignerKeyFile), 0o600, false},
	{filepath.Join(natsDir, gatewaySignerKeyFile), 0o600, false},
	{filepath.Join(natsDir, enrolSignerKeyFile), 0o600, false},
	{filepath.Join(natsDir, systemSignerKeyFile), 0o600, false},
	{filepath.Join(natsDir, accountPubFile), 0o644, false},
	{filepath.Join(natsDir, systemPubFile), 0o644, false},
	// The revocations as last pushed: the node starts with them.
	{filepath.Join(natsDir, accountJWTFile), 0o600, true},
	{filepath.Join(natsauth.TLSDir, natsauth.CACertFile), 0o644, false},
	{filepath.Join(natsauth.TLSDir, natsauth.CAKeyFile), 0o600, false},
	// Absent when the first gateway signs with --signing_key FILE: give
	// the replicas the same file.
	{filepath.Join(signingDir, signingKeyFile), 0o600, true},
	{filepath.Join(signingDir, previousKeyFile), 0o600, true},
	// A rotation under way: the old key and the key sets agents follow.
	{filepath.Join(signingDir, retiringKeyFile), 0o600, true},
	{filepath.Join(signingDir, keySetsFile), 0o644, true},
	{dataFormatFile, 0o600, true},
}

// SeedReplica writes into to (a directory that must not exist or be
// empty; created 0700) the keys of the fleet whose gateway's data
// directory is from: the NATS operator, the accounts' public keys and
// their signing keys,
// the fleet CA and the signing key. Started with to as its data
// directory and the same cluster, another gateway joins the fleet. from
// may belong to a running gateway: these files do not change once made
// (the account JWT is replaced whole). It returns the files written,
// relative to to.
func SeedReplica(from, to string) ([]string, error) {
	for _, f := range keyFiles {
		if _, err := readSeedFile(filepath.Join(from, natsDir, f.name), f.prefix, f.what); err != nil {
			return nil, fmt.Errorf("%s is not a gateway's data directory with its NATS keys (start that gateway once first): %w", from, err)
		}
	}
	for _, a := range accountKeys {
		if _, err := readPubFile(filepath.Join(from, natsDir, a.pubFile), a.what); err != nil {
			return nil, fmt.Errorf("%s is not a gateway's data directory with its NATS keys (start that gateway once first): %w", from, err)
		}
	}
	if _, err := natsauth.LoadCA(from); err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(to); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%s is not empty: a replica's seed goes into a new directory (a data directory that holds a store already belongs to a gateway)", to)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("seed directory: %w", err)
	}
	var written []string
	for _, f := range seedFiles {
		data, err := os.ReadFile(filepath.Join(from, f.path))
		if errors.Is(err, os.ErrNotExist) && f.optional {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		dst := filepath.Join(to, f.path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		if err := writeFileAtomic(dst, data, f.mode); err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		written = append(written, f.path)
	}
	if err := os.Chmod(to, 0o700); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	return written, nil
}
