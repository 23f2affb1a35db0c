package gateway

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/fleetmcp/fleetmcp/gateway/natsauth"

	"github.com/fleetmcp/fleetmcp/gateway/internal/fsutil"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
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
var seedFiles = append(slices.Clone(natsauth.SeedFiles), []natsauth.SeedFile{
	// Absent when the first gateway signs with --signing_key FILE: give
	// the replicas the same file.
	{Path: filepath.Join(signing.Dir, signing.KeyFile), Mode: 0o600, Optional: true},
	{Path: filepath.Join(signing.Dir, signing.PreviousKeyFile), Mode: 0o600, Optional: true},
	// A rotation under way: the old key and the key sets agents follow.
	{Path: filepath.Join(signing.Dir, signing.RetiringKeyFile), Mode: 0o600, Optional: true},
	{Path: filepath.Join(signing.Dir, signing.KeySetsFile), Mode: 0o644, Optional: true},
	{Path: dataFormatFile, Mode: 0o600, Optional: true},
}...)

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
	if err := natsauth.CheckSeedSource(from); err != nil {
		return nil, err
	}
	if entries, err := os.ReadDir(to); err == nil && len(entries) > 0 {
		return nil, fmt.Errorf("%s is not empty: a replica's seed goes into a new directory (a data directory that holds a store already belongs to a gateway)", to)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("seed directory: %w", err)
	}
	var written []string
	for _, f := range seedFiles {
		data, err := os.ReadFile(filepath.Join(from, f.Path))
		if errors.Is(err, os.ErrNotExist) && f.Optional {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		dst := filepath.Join(to, f.Path)
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		if err := fsutil.WriteFileAtomic(dst, data, f.Mode); err != nil {
			return nil, fmt.Errorf("seed: %w", err)
		}
		written = append(written, f.Path)
	}
	if err := os.Chmod(to, 0o700); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	return written, nil
}
