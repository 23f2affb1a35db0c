// Package identity keeps an agent's identity in the fleet on its host:
// the nkey the agent generated itself (its seed never leaves the host),
// the NATS credential the gateway issued for it, and what the agent
// learnt when it enrolled (its host name, the gateway, the CA pin, the
// NATS URLs and CA). They live in the agent's state directory, which no
// tool may reach:
//
//	<state_dir>/identity/agent.nk        the nkey user seed (0600)
//	<state_dir>/identity/agent.jwt       the current user JWT (0600)
//	<state_dir>/identity/enrolment.json  the enrolment (0600)
//
// Every file is replaced atomically (temporary file, fsync, rename, fsync
// of the directory), so a crash leaves the old one or the new one.
//
// It is also the agent's side of enrolment (protocol/enrol.go): Join
// enrols over the gateway's fleet API, trusting only the CA the operator
// pinned (pin.go); Identity.Recover gets a new credential the same way
// when the old one expired; Identity.Renew renews it over the agent's
// NATS connection. This package must not import the agent package; it
// imports nothing of the module but protocol and the state directory's
// lock (statelock), which the agent takes too.
package identity

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent/safefs"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// File names in the identity directory.
const (
	Dir           = "identity"
	KeyFile       = "agent.nk"
	JWTFile       = "agent.jwt"
	EnrolmentFile = "enrolment.json"
)

// ErrNotEnrolled reports a state directory without a complete identity.
var ErrNotEnrolled = errors.New("not enrolled")

// joinHint says how an agent gets an identity.
const joinHint = "run fleet-agent join --gateway https://GATEWAY:8443 --ca_pin PIN --token_file - and paste the join token " +
	"(the fleet's operator gets the command and the token from fleetctl token create)"

// Store is the identity directory of a state directory.
type Store struct {
	dir string
}

// Open returns the identity store of stateDir; it touches nothing.
func Open(stateDir string) *Store { return &Store{dir: filepath.Join(stateDir, Dir)} }

// Dir returns the identity directory.
func (s *Store) Dir() string { return s.dir }

func (s *Store) path(name string) string { return filepath.Join(s.dir, name) }

// LoadKey reads the agent's key. Its error wraps ErrNotEnrolled when
// there is none.
func (s *Store) LoadKey() (nkeys.KeyPair, error) {
	path := s.path(KeyFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no agent key; %s", ErrNotEnrolled, s.dir, joinHint)
	}
	if err != nil {
		return nil, fmt.Errorf("read the agent key: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			return nil, fmt.Errorf("%s is readable by others (mode %v) and cannot be made private: %w", path, fi.Mode().Perm(), err)
		}
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(data))))
	if err != nil {
		return nil, fmt.Errorf("%s is damaged (%w): it holds this agent's key; restore it, or delete the %s directory and enrol the host again", path, err, s.dir)
	}
	if pub, err := kp.PublicKey(); err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return nil, fmt.Errorf("%s holds no user key (an SU... seed): restore it, or delete the %s directory and enrol the host again", path, s.dir)
	}
	return kp, nil
}

// LoadOrCreateKey reads the agent's key, generating and storing one when
// there is none. The key file is created exclusively: when another
// process made one meanwhile (two joins at once on a fresh state
// directory that did not take its lock), this one is refused rather than
// replacing a key the other may have enrolled already. The caller holds
// the state directory's lock (statelock), so that it does not happen.
func (s *Store) LoadOrCreateKey() (nkeys.KeyPair, error) {
	kp, err := s.LoadKey()
	if !errors.Is(err, ErrNotEnrolled) {
		return kp, err
	}
	if kp, err = nkeys.CreateUser(); err != nil {
		return nil, fmt.Errorf("generate the agent key: %w", err)
	}
	seed, _ := kp.Seed()
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		kp.Wipe()
		return nil, fmt.Errorf("store the agent key: %w", err)
	}
	if err := createFileExclusive(s.path(KeyFile), append(seed, '\n')); err != nil {
		kp.Wipe()
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("store the agent key: another process made %s at the same time (a second join on this state directory?); "+
				"nothing was enrolled by this one: let the other finish, then run fleet-agent join again if it failed", s.path(KeyFile))
		}
		return nil, fmt.Errorf("store the agent key: %w", err)
	}
	return kp, nil
}

// RemoveKey deletes the agent's key, credential and enrolment, so that
// the next LoadOrCreateKey makes a new key.
func (s *Store) RemoveKey() error {
	for _, name := range []string{JWTFile, EnrolmentFile, KeyFile} {
		if err := os.Remove(s.path(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// SaveJWT stores the agent's user JWT, replacing the one before.
func (s *Store) SaveJWT(token string) error {
	if _, err := jwt.DecodeUserClaims(token); err != nil {
		return fmt.Errorf("store the agent credential: not a user JWT: %w", err)
	}
	return s.write(JWTFile, []byte(token+"\n"))
}

// LoadJWT reads the agent's user JWT. Its error wraps ErrNotEnrolled when
// there is none.
func (s *Store) LoadJWT() (string, error) {
	data, err := os.ReadFile(s.path(JWTFile))
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w: %s has the agent's key but no credential (an interrupted join?); %s", ErrNotEnrolled, s.dir, joinHint)
	}
	if err != nil {
		return "", fmt.Errorf("read the agent credential: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// SaveEnrolment stores what the agent learnt when it enrolled.
func (s *Store) SaveEnrolment(e *Enrolment) error {
	data, err := e.encode()
	if err != nil {
		return err
	}
	return s.write(EnrolmentFile, data)
}

// LoadEnrolment reads what the agent learnt when it enrolled. Its error
// wraps ErrNotEnrolled when there is nothing.
func (s *Store) LoadEnrolment() (*Enrolment, error) {
	path := s.path(EnrolmentFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s has no %s (an interrupted join?); %s", ErrNotEnrolled, s.dir, EnrolmentFile, joinHint)
	}
	if err != nil {
		return nil, fmt.Errorf("read the enrolment: %w", err)
	}
	e, err := ParseEnrolment(data)
	if err != nil {
		return nil, fmt.Errorf("%s is damaged: %w; enrol the host again", path, err)
	}
	return e, nil
}

// write replaces name in the identity directory with data (0600).
func (s *Store) write(name string, data []byte) error {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return err
	}
	return writeFileAtomic(s.path(name), data)
}

// writeFileAtomic replaces path with data, mode 0600: whole or not at
// all, and durable once it returns.
func writeFileAtomic(path string, data []byte) error {
	return safefs.WriteStateFile(path, data)
}

// createFileExclusive creates path with data, mode 0600, whole or not at
// all, and fails with an error matching os.ErrExist when path exists: the
// data goes to a temporary file that is then linked (link(2) never
// replaces a name) to path.
func createFileExclusive(path string, data []byte) error {
	return safefs.PlaceStateFile(path, data, func(tmp, path string) error {
		err := os.Link(tmp, path)
		if err == nil || errors.Is(err, os.ErrExist) {
			return err
		}
		// A file system without hard links: an exclusive create, which a
		// crash may leave short (LoadKey then says the key is damaged).
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = f.Write(data)
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
		}
		return err
	})
}

// Identity is an agent's loaded identity.
type Identity struct {
	store *Store
	// Seed is the agent's nkey user seed; PublicKey its public key.
	Seed      []byte
	PublicKey string
	Enrolment Enrolment

	// replaceMu serialises changes of the stored credential.
	replaceMu sync.Mutex
	mu        sync.Mutex
	token     string
	issued    time.Time
	expires   time.Time
}

// Load reads the identity in stateDir. Its error wraps ErrNotEnrolled,
// and says how to enrol, when the state directory holds none (or only
// part of one).
func Load(stateDir string) (*Identity, error) {
	s := Open(stateDir)
	kp, err := s.LoadKey()
	if err != nil {
		return nil, err
	}
	defer kp.Wipe()
	token, err := s.LoadJWT()
	if err != nil {
		return nil, err
	}
	e, err := s.LoadEnrolment()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	seed = slices.Clone(seed) // Wipe below overwrites the key's own copy
	pub, _ := kp.PublicKey()
	id := &Identity{store: s, Seed: seed, PublicKey: pub, Enrolment: *e}
	if err := id.setJWT(token); err != nil {
		return nil, fmt.Errorf("%s: %w; enrol the host again", s.path(JWTFile), err)
	}
	return id, nil
}

// check makes sure token is a user JWT for the agent's key and host,
// and returns when it was issued and when it expires (zero: never).
func (id *Identity) check(token string) (issued, expires time.Time, err error) {
	uc, err := checkCredential(token, id.PublicKey, id.Enrolment.Host)
	if err != nil {
		return time.Time{}, time.Time{}, err
	}
	if uc.IssuedAt > 0 {
		issued = time.Unix(uc.IssuedAt, 0)
	}
	if uc.Expires > 0 {
		expires = time.Unix(uc.Expires, 0)
	}
	return issued, expires, nil
}

// setJWT takes token as the current credential.
func (id *Identity) setJWT(token string) error {
	issued, expires, err := id.check(token)
	if err != nil {
		return err
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	id.token, id.issued, id.expires = token, issued, expires
	return nil
}

// JWT returns the current user JWT (agent.Credentials.JWT).
func (id *Identity) JWT() (string, error) {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.token, nil
}

// Expires returns when the current credential expires (zero: never).
func (id *Identity) Expires() time.Time {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.expires
}

// Validity returns when the current credential was issued and when it
// expires (zero: not said, never).
func (id *Identity) Validity() (issued, expires time.Time) {
	id.mu.Lock()
	defer id.mu.Unlock()
	return id.issued, id.expires
}

// Replace stores token, a new credential for the same key and host, and
// makes it the current one: the next connection uses it.
func (id *Identity) Replace(token string) error {
	if _, _, err := id.check(token); err != nil {
		return fmt.Errorf("new credential: %w", err)
	}
	id.replaceMu.Lock()
	defer id.replaceMu.Unlock()
	if err := id.store.SaveJWT(token); err != nil {
		return err
	}
	return id.setJWT(token)
}

// GatewayKeys returns the gateway keys the agent trusts, as enrolment.json
// holds them.
func (id *Identity) GatewayKeys() protocol.KeyState {
	id.mu.Lock()
	defer id.mu.Unlock()
	return protocol.KeyState{Serial: id.Enrolment.SigningKeySerial, Keys: slices.Clone(id.Enrolment.SigningKeys)}
}

// SaveGatewayKeys stores the gateway keys of a key set the agent took in,
// so that it trusts them after a restart too.
func (id *Identity) SaveGatewayKeys(st protocol.KeyState) error {
	id.replaceMu.Lock()
	defer id.replaceMu.Unlock()
	e, err := id.store.LoadEnrolment()
	if err != nil {
		return err
	}
	e.SigningKeys, e.SigningKeySerial = slices.Clone(st.Keys), st.Serial
	if err := id.store.SaveEnrolment(e); err != nil {
		return fmt.Errorf("store the gateway keys: %w", err)
	}
	id.mu.Lock()
	id.Enrolment.SigningKeys, id.Enrolment.SigningKeySerial = e.SigningKeys, e.SigningKeySerial
	id.mu.Unlock()
	return nil
}
