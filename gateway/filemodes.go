package gateway

import (
	"path/filepath"

	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
)

// StatePaths are the paths of cfg that hold the gateway's state and
// secrets, for the checks of their modes at start: Dirs, which others
// may not write (the data directory and its key directories); Own, the
// keys the gateway writes itself (only their owner may read them); and
// Provided, the keys and credentials the operator gives (TLS keys, NATS
// creds and signing keys), which a group may read but others may not.
type StatePaths struct {
	Dirs, Own, Provided []string
}

// Paths returns cfg's StatePaths (absolute where cfg's are).
func (cfg *Config) Paths() StatePaths {
	var p StatePaths
	if d := cfg.DataDir; d != "" {
		p.Dirs = []string{d, filepath.Join(d, natsauth.KeysDir), filepath.Join(d, natsauth.TLSDir), filepath.Join(d, signing.Dir)}
		p.Own = append(p.Own, natsauth.CAKeyPath(d), filepath.Join(d, signing.Dir, signing.KeyFile), filepath.Join(d, signing.Dir, signing.RetiringKeyFile))
		p.Own = append(p.Own, natsauth.KeyFiles(d)...)
		// The accounts' own keys of a data directory not moved to scoped
		// keys yet: secrets until the start that removes them.
		p.Own = append(p.Own, natsauth.LegacyKeyFiles(d)...)
	}
	for _, f := range []string{cfg.APITLSKey, cfg.TLSKey, cfg.NATSTLSKey, cfg.SigningKeyFile,
		cfg.NATSCredsFile, cfg.NATSSystemCredsFile, cfg.NATSAgentSigningKeyFile, cfg.NATSOperatorSigningKeyFile} {
		if f != "" {
			p.Provided = append(p.Provided, f)
		}
	}
	return p
}
