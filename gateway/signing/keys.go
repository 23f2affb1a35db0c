package signing

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/fsutil"
)

// This file keeps the gateway's ed25519 signing keys, with which it signs
// every message that makes an agent act (protocol/envelope.go), skill
// manifests and desired states. Agents learn the public keys when they
// enrol and trust nothing else, so the replicas of one fleet share the
// keys: copy the whole signing directory (DATA_DIR/signing, or the
// directory of --signing_key), and reload or restart them.
//
// The directory holds:
//
//	gateway.key     the key the gateway signs with (a seed, 0600)
//	retiring.key    during a rotation, the key before it (0600)
//	keysets.json    the chain of key sets agents move on with
//	previous.keys   before any rotation: older public keys still trusted
//
// A rotation (Rotate, fleet-gateway signing-key rotate) makes a
// new key and adds a key set with the new key and the old one, signed by
// both: agents take it in as they connect or when a gateway pushes it,
// and the gateway signs each host's messages with the newest key the
// host announces it trusts (protocol.Announce.TrustedKeys), so no call
// fails during the overlap. Retiring the old key (Retire)
// adds a set with the new key alone, signed by it; agents then refuse
// the old key.

// The files of the signing directory (see above), and its name in the
// data directory.
const (
	Dir             = "signing"
	KeyFile         = "gateway.key"
	RetiringKeyFile = "retiring.key"
	KeySetsFile     = "keysets.json"
	PreviousKeyFile = "previous.keys"
	seedPrefix      = "ed25519-seed:"
)

// Keys is the gateway's signing keys. Reload swaps their state; every
// method is safe to call at any time from any goroutine.
type Keys struct {
	path string
	st   atomic.Pointer[keyState]
}

// keyState is the signing keys as loaded.
type keyState struct {
	priv ed25519.PrivateKey
	env  *protocol.EnvelopeSigner
	// retiring is the key before priv during a rotation (nil: none).
	retiring    ed25519.PrivateKey
	retiringEnv *protocol.EnvelopeSigner
	// Trusted are the public keys agents trust: those of the latest key
	// set, or, before any, the current key and previous.keys.
	trusted []string
	// Chain is the key set chain; serial its latest set's (0: none).
	chain  protocol.KeySetChain
	serial uint64
}

// KeyPath is where the key lives: file (--signing_key) when set, else
// DATA_DIR/signing/gateway.key; empty when there is neither.
func KeyPath(file, dataDir string) string {
	if file != "" {
		return file
	}
	if dataDir != "" {
		return filepath.Join(dataDir, Dir, KeyFile)
	}
	return ""
}

// Open reads the keys at path, generating the key when
// the file does not exist (only in the data directory: a configured file
// must exist).
func Open(path string, create bool) (*Keys, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) && create {
		if _, err := Create(path); err != nil {
			return nil, err
		}
	}
	k := &Keys{path: path}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads the signing directory again and puts it in force; it
// reports nothing changed on error, leaving the keys as they were.
func (k *Keys) Reload() error {
	st, err := loadKeyState(k.path)
	if err != nil {
		return err
	}
	k.st.Store(st)
	return nil
}

// loadKeyState reads and checks the signing directory of path.
func loadKeyState(path string) (*keyState, error) {
	priv, err := readSigningKey(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	st := &keyState{priv: priv, env: protocol.NewEnvelopeSigner(priv)}
	if st.retiring, err = readSigningKey(filepath.Join(dir, RetiringKeyFile)); errors.Is(err, os.ErrNotExist) {
		st.retiring = nil
	} else if err != nil {
		return nil, err
	} else {
		st.retiringEnv = protocol.NewEnvelopeSigner(st.retiring)
	}
	chain, err := readKeySets(filepath.Join(dir, KeySetsFile))
	if err != nil {
		return nil, err
	}
	st.chain = chain
	cur := publicOf(priv)
	if n := len(chain.Sets); n > 0 {
		last := chain.Sets[n-1].Set
		st.trusted, st.serial = slices.Clone(last.Keys), last.Serial
		if last.Keys[0] != cur {
			return nil, fmt.Errorf("%s is not the first key of the latest key set in %s: the files come from different rotations; copy the whole %s directory from where the last rotation was made",
				path, KeySetsFile, dir)
		}
		if st.retiring != nil && !slices.Contains(last.Keys, publicOf(st.retiring)) {
			return nil, fmt.Errorf("%s holds a key the latest key set in %s no longer lists: it was retired; remove %s", RetiringKeyFile, KeySetsFile, RetiringKeyFile)
		}
		return st, nil
	}
	if st.retiring != nil {
		return nil, fmt.Errorf("%s exists but %s does not: the directory is from an interrupted rotation; copy the whole %s directory from where it was made", RetiringKeyFile, KeySetsFile, dir)
	}
	st.trusted = []string{cur}
	prev, err := readPreviousKeys(filepath.Join(dir, PreviousKeyFile))
	if err != nil {
		return nil, err
	}
	for _, p := range prev {
		if !slices.Contains(st.trusted, p) {
			st.trusted = append(st.trusted, p)
		}
	}
	return st, nil
}

func publicOf(priv ed25519.PrivateKey) string {
	pub, _ := priv.Public().(ed25519.PublicKey)
	return protocol.FormatSigningKey(pub)
}

// readKeySets reads keysets.json (none: an empty chain) and checks it:
// serials one after another, each set signed by a key of the set before.
func readKeySets(path string) (protocol.KeySetChain, error) {
	var chain protocol.KeySetChain
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return chain, nil
	}
	if err != nil {
		return chain, fmt.Errorf("gateway key sets: %w", err)
	}
	if err := json.Unmarshal(data, &chain); err != nil {
		return chain, fmt.Errorf("%s is damaged (%v): copy it from another replica's signing directory", path, err)
	}
	if len(chain.Sets) == 0 {
		return chain, nil
	}
	first := chain.Sets[0].Set
	if err := first.Validate(); err != nil {
		return chain, fmt.Errorf("%s: %w", path, err)
	}
	for i := 1; i < len(chain.Sets); i++ {
		if chain.Sets[i].Set.Serial != chain.Sets[i-1].Set.Serial+1 {
			return chain, fmt.Errorf("%s: key set %d follows set %d; serials go up one at a time", path, chain.Sets[i].Set.Serial, chain.Sets[i-1].Set.Serial)
		}
	}
	end, err := protocol.KeyState{Serial: first.Serial, Keys: first.Keys}.Apply(&chain)
	if err != nil || end.Serial != chain.Sets[len(chain.Sets)-1].Set.Serial {
		return chain, fmt.Errorf("%s: the chain does not hold together: %v", path, err)
	}
	return chain, nil
}

// Create makes a new signing key at path (0600), in a directory it
// makes when missing.
func Create(path string) (ed25519.PrivateKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate the gateway signing key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("gateway signing key: %w", err)
	}
	if err := fsutil.WriteFileAtomic(path, seedLine(priv), 0o600); err != nil {
		return nil, fmt.Errorf("store the gateway signing key: %w", err)
	}
	return priv, nil
}

func seedLine(priv ed25519.PrivateKey) []byte {
	return []byte(seedPrefix + base64.RawURLEncoding.EncodeToString(priv.Seed()) + "\n")
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

// Sign signs msg for purpose with the current key.
func (k *Keys) Sign(purpose string, msg []byte) protocol.Signature {
	return protocol.SignBytes(k.st.Load().priv, purpose, msg)
}

// Resign returns sig, over msg for purpose, made with the current key: a
// signature by another key the gateway takes its own signatures by (the
// retiring key, an older current one) is made again; any other is
// returned as it is.
func (k *Keys) Resign(purpose string, msg []byte, sig protocol.Signature) protocol.Signature {
	st := k.st.Load()
	if sig.Key == publicOf(st.priv) || protocol.VerifyBytes(k.Verifiable(), purpose, msg, sig) != nil {
		return sig
	}
	return protocol.SignBytes(st.priv, purpose, msg)
}

// Trusted returns the public keys agents trust, the current one first.
func (k *Keys) Trusted() []string { return slices.Clone(k.st.Load().trusted) }

// Verifiable returns the keys the gateway takes its own signatures by:
// those agents trust, and the retiring key.
func (k *Keys) Verifiable() []string {
	st := k.st.Load()
	out := slices.Clone(st.trusted)
	if st.retiring != nil && !slices.Contains(out, publicOf(st.retiring)) {
		out = append(out, publicOf(st.retiring))
	}
	return out
}

// Chain returns the key set chain and its serial.
func (k *Keys) Chain() (protocol.KeySetChain, uint64) {
	st := k.st.Load()
	return st.chain, st.serial
}

// EnvelopeSigner returns the signer for a host that trusts the keys ids
// (its announce's TrustedKeys): the current key when it trusts it, else
// the retiring key when it trusts that; nil when it trusts neither.
func (k *Keys) EnvelopeSigner(ids []string) *protocol.EnvelopeSigner {
	st := k.st.Load()
	switch {
	case slices.Contains(ids, st.env.KeyID()):
		return st.env
	case st.retiringEnv != nil && slices.Contains(ids, st.retiringEnv.KeyID()):
		return st.retiringEnv
	}
	return nil
}

// Serial is the serial of the latest key set (0: none).
func (k *Keys) Serial() uint64 { return k.st.Load().serial }

// CurrentKeyID is the id of the key the gateway signs with.
func (k *Keys) CurrentKeyID() string { return k.st.Load().env.KeyID() }

// Path is the file of the key the gateway signs with.
func (k *Keys) Path() string { return k.path }

// New returns keys held in memory only: priv signs, retiring (nil: none)
// is the key before it, and agents trust both. Reload reads nothing.
func New(priv, retiring ed25519.PrivateKey) *Keys {
	k := &Keys{}
	st := &keyState{priv: priv, env: protocol.NewEnvelopeSigner(priv), trusted: []string{publicOf(priv)}}
	if retiring != nil {
		st.retiring, st.retiringEnv = retiring, protocol.NewEnvelopeSigner(retiring)
		st.trusted = append(st.trusted, publicOf(retiring))
	}
	k.st.Store(st)
	return k
}

// RotationReport says what a rotation or a retirement did.
type RotationReport struct {
	// Serial is the new key set's; Keys its keys, the one the gateway
	// signs with first.
	Serial uint64
	Keys   []string
	Dir    string
}

// Rotate starts a rotation of the signing key at path (the
// gateway's --signing_key, or DATA_DIR/signing/gateway.key): it makes a
// new key, keeps the current one as retiring.key, and adds a key set of
// both, signed by both, to keysets.json. Gateways that load the
// directory (copy it to every replica, then reload) sign each host's
// messages with the new key once the host has taken in the new set.
func Rotate(path string, now time.Time) (*RotationReport, error) {
	st, err := loadKeyState(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if st.retiring != nil {
		return nil, fmt.Errorf("a rotation is under way already (%s exists): retire the old key first (fleet-gateway signing-key retire)", filepath.Join(dir, RetiringKeyFile))
	}
	if len(st.chain.Sets) >= protocol.MaxKeySets {
		return nil, fmt.Errorf("%s holds %d key sets, the most agents take: hosts that missed them all must enrol again anyway; start a new chain by enrolling the fleet again", KeySetsFile, len(st.chain.Sets))
	}
	_, next, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate the new signing key: %w", err)
	}
	set := protocol.KeySet{Serial: st.serial + 1, Keys: []string{publicOf(next), publicOf(st.priv)}, At: now.UTC()}
	signed, err := protocol.SignKeySet(set, st.priv, next)
	if err != nil {
		return nil, err
	}
	chain := st.chain
	chain.Sets = append(slices.Clone(chain.Sets), signed)
	data, err := json.MarshalIndent(chain, "", "  ")
	if err != nil {
		return nil, err
	}
	// The old key first, so that a rotation cut short leaves a
	// directory the gateway refuses with a clear message rather than
	// one that lost a key.
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, RetiringKeyFile), seedLine(st.priv), 0o600); err != nil {
		return nil, err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, KeySetsFile), append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := fsutil.WriteFileAtomic(path, seedLine(next), 0o600); err != nil {
		return nil, err
	}
	return &RotationReport{Serial: set.Serial, Keys: set.Keys, Dir: dir}, nil
}

// Retire ends a rotation: it adds a key set of the current key
// alone, signed by it, and removes retiring.key. Agents that take the
// set in refuse the old key from then on.
func Retire(path string, now time.Time) (*RotationReport, error) {
	st, err := loadKeyState(path)
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(path)
	if st.retiring == nil {
		return nil, fmt.Errorf("no rotation is under way (%s does not exist): there is no old key to retire", filepath.Join(dir, RetiringKeyFile))
	}
	set := protocol.KeySet{Serial: st.serial + 1, Keys: []string{publicOf(st.priv)}, At: now.UTC()}
	signed, err := protocol.SignKeySet(set, st.priv)
	if err != nil {
		return nil, err
	}
	chain := st.chain
	chain.Sets = append(slices.Clone(chain.Sets), signed)
	data, err := json.MarshalIndent(chain, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, KeySetsFile), append(data, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.Remove(filepath.Join(dir, RetiringKeyFile)); err != nil {
		return nil, fmt.Errorf("remove the retired key: %w", err)
	}
	return &RotationReport{Serial: set.Serial, Keys: set.Keys, Dir: dir}, nil
}
