package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// embeddedAccount is the operator-mode setup of the embedded server: the
// operator and its two accounts, built from the keys in DataDir/nats at
// every start. The fleet account JWT is rebuilt with the revocations of
// the one the gateway last pushed (DataDir/nats/account.jwt), so a
// restart keeps them, and the in-memory account resolver (which forgets
// pushes on restart) is preloaded with it.
type embeddedAccount struct {
	keys     *natsKeys
	maxCall  time.Duration
	path     string // DataDir/nats/account.jwt
	operator *jwt.OperatorClaims
	sysJWT   string
	resolver *server.MemAccResolver

	mu   sync.Mutex
	revs jwt.RevocationList // what the server holds
	// closed: the server holds the account without its agent signing
	// key, refusing every agent, until the first push (a cluster node
	// starting, cluster.go).
	closed bool
}

// newEmbeddedAccount builds the operator, system account and fleet
// account JWTs from keys, taking the revocations of the account JWT
// saved in dataDir (when it is the fleet account's, signed by the
// operator), and saves the new account JWT. With closed, the server
// starts with the fleet account refusing agents until the first push.
func newEmbeddedAccount(dataDir string, keys *natsKeys, maxCall time.Duration, closed bool, log *slog.Logger) (*embeddedAccount, error) {
	e := &embeddedAccount{keys: keys, maxCall: maxCall, path: filepath.Join(dataDir, natsDir, accountJWTFile), resolver: &server.MemAccResolver{}, closed: closed}
	opPub, sysPub := publicKey(keys.operator), publicKey(keys.system)
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = operatorName
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(keys.operator)
	if err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	if e.operator, err = jwt.DecodeOperatorClaims(opJWT); err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = systemAccountName
	if e.sysJWT, err = sc.Encode(keys.operator); err != nil {
		return nil, fmt.Errorf("system account JWT: %w", err)
	}
	revs, err := e.saved()
	if err != nil {
		// The records restore them once JetStream is up (a reconcile
		// follows every start).
		log.Warn("the saved fleet account JWT is unusable; revocations come back from the agent records once JetStream is up", "file", e.path, "err", err)
	}
	ac := e.claims(revs)
	token, err := e.sign(ac)
	if err != nil {
		return nil, err
	}
	if err := e.save(token); err != nil {
		return nil, err
	}
	e.revs = ac.Revocations
	if closed {
		// Agents' credentials are signed by the agent signing key: an
		// account without it accepts none of them. The gateway's own
		// users are signed by the account key itself.
		ac.SigningKeys = jwt.SigningKeys{}
		if token, err = e.sign(ac); err != nil {
			return nil, err
		}
	}
	_ = e.resolver.Store(sysPub, e.sysJWT)
	_ = e.resolver.Store(publicKey(keys.account), token)
	return e, nil
}

// saved returns the revocations of the account JWT in DataDir/nats.
func (e *embeddedAccount) saved() (jwt.RevocationList, error) {
	data, err := os.ReadFile(e.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	ac, err := jwt.DecodeAccountClaims(strings.TrimSpace(string(data)))
	switch {
	case err != nil:
		return nil, err
	case ac.Subject != publicKey(e.keys.account):
		return nil, fmt.Errorf("it is the JWT of account %s, not of the fleet account %s", ac.Subject, publicKey(e.keys.account))
	case ac.Issuer != publicKey(e.keys.operator):
		return nil, fmt.Errorf("it was signed by %s, not by the operator %s", ac.Issuer, publicKey(e.keys.operator))
	}
	return ac.Revocations, nil
}

// claims builds the fleet account's claims with revs.
func (e *embeddedAccount) claims(revs jwt.RevocationList) *jwt.AccountClaims {
	ac := fleetAccountClaims(publicKey(e.keys.account), publicKey(e.keys.agentSigner), e.maxCall)
	if len(revs) > 0 {
		ac.Revocations = maps.Clone(revs)
	}
	return ac
}

// configure puts operator mode into the server's options.
func (e *embeddedAccount) configure(opts *server.Options) {
	opts.TrustedOperators = []*jwt.OperatorClaims{e.operator}
	opts.SystemAccount = publicKey(e.keys.system)
	opts.AccountResolver = e.resolver
}

// mustPush reports whether the server holds the account closed to
// agents, so that a push is due even when the revocations agree.
func (e *embeddedAccount) mustPush() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

func (e *embeddedAccount) current(context.Context, *nats.Conn) (*jwt.AccountClaims, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.claims(e.revs), nil
}

func (e *embeddedAccount) sign(ac *jwt.AccountClaims) (string, error) {
	return ac.Encode(e.keys.operator)
}

func (e *embeddedAccount) save(token string) error {
	if err := writeFileAtomic(e.path, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("save the fleet account JWT: %w", err)
	}
	return nil
}

func (e *embeddedAccount) pushed(ac *jwt.AccountClaims, token string) {
	e.mu.Lock()
	e.revs = maps.Clone(ac.Revocations)
	e.closed = false
	e.mu.Unlock()
	// Should the server look the account up again, it finds this one.
	_ = e.resolver.Store(ac.Subject, token)
}

// localUser issues the JWT of an in-process user of account (signed by
// its key) with a key made for this process only, that may publish
// anything but deny, and the options that connect with it.
func localUser(name string, account nkeys.KeyPair, deny ...string) (nats.Option, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	token, err := userJWT(kp, name, account, "", deny...)
	if err != nil {
		return nil, fmt.Errorf("%s user JWT: %w", name, err)
	}
	seed, _ := kp.Seed()
	return nats.UserJWTAndSeed(token, string(seed)), nil
}

// auditStreamAdmin returns how the gateway updates the audit stream's
// configuration, which its runtime user may not (runtimeDenied): on the
// embedded server, as a user of the fleet account made for that one
// update and closed after it; on an external cluster not at all (nil),
// the operator does it with an admin credential. On the embedded server
// this is no boundary against someone who holds the data directory (the
// account key is in it; README, Audit, says what that allows), only
// against the gateway's own long-lived connection.
func (g *Gateway) auditStreamAdmin() streamUpdater {
	if g.ns == nil || g.fleetAccount == nil {
		return nil
	}
	admin := g.streamAdmin(protocol.AuditStream)
	return func(ctx context.Context, cfg jetstream.StreamConfig) error {
		return admin(ctx, func(js jetstream.JetStream) error {
			_, err := js.UpdateStream(ctx, cfg)
			return err
		})
	}
}
