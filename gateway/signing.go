package gateway

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file keeps the gateway's ed25519 signing key, with which it signs
// skill manifests and desired states (protocol.SignBytes). Agents learn
// the public keys when they enrol and trust nothing else, so replicas of
// one fleet must share the key: copy DATA_DIR/signing/gateway.key, or
// point --signing_key at one file. Older public keys listed in
// previous.keys beside the key file stay trusted while agents move on.

const (
	signingDir      = "signing"
	signingKeyFile  = "gateway.key"
	previousKeyFile = "previous.keys"
	seedPrefix      = "ed25519-seed:"
)

// signingKey is the gateway's signing key and the public keys it hands
// agents (the current one first).
type signingKey struct {
	priv    ed25519.PrivateKey
	trusted []string
	path    string
}

// signingKeyPath is where the key lives: the configured file, else
// DATA_DIR/signing/gateway.key; empty when there is neither.
func signingKeyPath(cfg *Config) string {
	if cfg.SigningKeyFile != "" {
		return cfg.SigningKeyFile
	}
	if cfg.DataDir != "" {
		return filepath.Join(cfg.DataDir, signingDir, signingKeyFile)
	}
	return ""
}

// loadOrCreateSigningKey reads the key at path, generating it when the
// file does not exist (only in the data directory: a configured file
// must exist).
func loadOrCreateSigningKey(path string, create bool) (*signingKey, error) {
	priv, err := readSigningKey(path)
	if errors.Is(err, os.ErrNotExist) && create {
		priv, err = createSigningKey(path)
	}
	if err != nil {
		return nil, err
	}
	pub, _ := priv.Public().(ed25519.PublicKey)
	k := &signingKey{priv: priv, path: path, trusted: []string{protocol.FormatSigningKey(pub)}}
	prev, err := readPreviousKeys(filepath.Join(filepath.Dir(path), previousKeyFile))
	if err != nil {
		return nil, err
	}
	for _, p := range prev {
		if !slices.Contains(k.trusted, p) {
			k.trusted = append(k.trusted, p)
		}
	}
	return k, nil
}

func createSigningKey(path string) (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate the gateway signing key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("gateway signing key: %w", err)
	}
	line := seedPrefix + base64.RawURLEncoding.EncodeToString(priv.Seed()) + "\n"
	if err := writeFileAtomic(path, []byte(line), 0o600); err != nil {
		return nil, fmt.Errorf("store the gateway signing key: %w", err)
	}
	return priv, nil
}

// readSigningKey reads a seed file; its error wraps os.ErrNotExist when
// there is none.
func readSigningKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the gateway signing key: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, fmt.Errorf("%s holds the gateway signing key and is readable by others (mode %v); make it 0600: %w", path, fi.Mode().Perm(), err)
		}
	}
	b64, ok := strings.CutPrefix(string(bytes.TrimSpace(data)), seedPrefix)
	seed, err := base64.RawURLEncoding.DecodeString(b64)
	if !ok || err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%s does not hold a gateway signing key (a line %q and the base64url of a 32-byte ed25519 seed); "+
			"copy it from another replica's data directory, or remove it to generate a new one (agents must then enrol again)", path, seedPrefix)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// readPreviousKeys reads older public keys, one a line (# comments); a
// missing file lists none.
func readPreviousKeys(path string) ([]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("previous signing keys: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if _, err := protocol.ParseSigningKey(line); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", path, n, err)
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("previous signing keys: %w", err)
	}
	return out, nil
}

// sign signs msg for purpose.
func (k *signingKey) sign(purpose string, msg []byte) protocol.Signature {
	return protocol.SignBytes(k.priv, purpose, msg)
}

// SigningKeys returns the public keys agents trust for this gateway's
// signatures (protocol.FormatSigningKey): the current key first, then
// older ones kept for rotation. Empty when the gateway has no signing
// key (an external cluster without --signing_key or --data_dir).
func (g *Gateway) SigningKeys() []string {
	if g.signer == nil {
		return nil
	}
	return slices.Clone(g.signer.trusted)
}

// openSigningKey loads (or makes) the signing key at start.
func (g *Gateway) openSigningKey() error {
	path := signingKeyPath(&g.cfg)
	if path == "" {
		g.log.Warn("no gateway signing key: skill rollout is off; set --signing_key FILE (shared by the replicas) or --data_dir")
		return nil
	}
	k, err := loadOrCreateSigningKey(path, g.cfg.SigningKeyFile == "")
	if err != nil {
		return err
	}
	g.signer = k
	return nil
}
