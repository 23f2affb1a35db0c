package natsauth

import (
	"context"
	"encoding/json"
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

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"

	"github.com/fleetmcp/fleetmcp/gateway/internal/fsutil"
)

// embeddedAccount is the operator-mode setup of the embedded server: the
// operator and its two accounts, built from the keys in DataDir/nats at
// every start. The fleet account JWT is rebuilt with the revocations of
// the one the gateway last pushed (DataDir/nats/account.jwt), so a
// restart keeps them, and the server's account resolver is preloaded
// with it.
//
// The server takes account changes from its gateway alone, in process
// (apply): its resolver tracks updates itself (fleetResolver), so the
// server does not serve $SYS.REQ.ACCOUNT.*.CLAIMS.UPDATE. The gateway
// serves it instead (serveClaimUpdates), for the other nodes of a
// cluster, and takes from what it is sent only revocations to add. So
// whoever holds the operator key and a system user can revoke keys, and
// nothing more: not add a signing key of their own to the fleet account
// (a user of any permissions), nor change the system account.
type embeddedAccount struct {
	keys     *natsKeys
	maxCall  time.Duration
	path     string // DataDir/nats/account.jwt
	operator *jwt.OperatorClaims
	sysJWT   string
	resolver *fleetResolver
	// admin is an unscoped signing key of the fleet account made for
	// this process only and never stored: it signs the one-off users
	// that change a protected stream's configuration (streamAdmin).
	// Only this node's server knows it.
	admin nkeys.KeyPair
	log   *slog.Logger

	mu   sync.Mutex
	own  map[string]bool    // this gateway's users' keys (keepOwn)
	srv  *server.Server     // set once started (setServer)
	revs jwt.RevocationList // what the server holds
	// since holds what addRevocations added after the last current
	// (nil before any), which apply keeps: the authority reads current,
	// works on it (the ledger, a push), then applies its copy, while
	// another node's push or the ledger may add a revocation.
	since jwt.RevocationList
	// closed: the server holds the account without its agent and
	// enrol signing keys, refusing every agent, until the first push (a
	// cluster node starting, cluster.go).
	closed bool
}

// fleetResolver is the embedded server's account resolver: in memory,
// and tracking updates itself, so the server leaves claim updates to
// the gateway.
type fleetResolver struct{ server.MemAccResolver }

func (*fleetResolver) IsTrackingUpdate() bool { return true }

// newEmbeddedAccount builds the operator, system account and fleet
// account JWTs from keys, taking the revocations of the account JWT
// saved in dataDir (when it is the fleet account's, signed by the
// operator), and saves the new account JWT. With closed, the server
// starts with the fleet account refusing agents until the first push.
func newEmbeddedAccount(dataDir string, keys *natsKeys, maxCall time.Duration, closed bool, log *slog.Logger) (*embeddedAccount, error) {
	admin, err := nkeys.CreateAccount()
	if err != nil {
		return nil, err
	}
	e := &embeddedAccount{keys: keys, maxCall: maxCall, path: filepath.Join(dataDir, natsDir, accountJWTFile), resolver: &fleetResolver{},
		admin: admin, log: log, closed: closed}
	opPub := publicKey(keys.operator)
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = operatorName
	oc.SystemAccount = keys.systemPub
	opJWT, err := oc.Encode(keys.operator)
	if err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	if e.operator, err = jwt.DecodeOperatorClaims(opJWT); err != nil {
		return nil, fmt.Errorf("operator JWT: %w", err)
	}
	sc := jwt.NewAccountClaims(keys.systemPub)
	sc.Name = systemAccountName
	sc.SigningKeys.AddScopedSigner(systemScope(publicKey(keys.systemSigner), keys.accountPub))
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
	if token, err = e.serverJWT(ac.Revocations); err != nil {
		return nil, err
	}
	_ = e.resolver.Store(keys.systemPub, e.sysJWT)
	_ = e.resolver.Store(keys.accountPub, token)
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
	case ac.Subject != e.keys.accountPub:
		return nil, fmt.Errorf("it is the JWT of account %s, not of the fleet account %s", ac.Subject, e.keys.accountPub)
	case ac.Issuer != publicKey(e.keys.operator):
		return nil, fmt.Errorf("it was signed by %s, not by the operator %s", ac.Issuer, publicKey(e.keys.operator))
	}
	return ac.Revocations, nil
}

// claims builds the fleet account's claims with revs: the scoped
// signing keys of agents, the gateway's users and enrol credentials,
// and this process's admin key.
func (e *embeddedAccount) claims(revs jwt.RevocationList) *jwt.AccountClaims {
	ac := fleetAccountClaims(e.keys.accountPub, publicKey(e.keys.agentSigner), e.maxCall)
	ac.SigningKeys.AddScopedSigner(gatewayScope(publicKey(e.keys.gatewaySigner)))
	ac.SigningKeys.AddScopedSigner(enrolScope(publicKey(e.keys.enrolSigner)))
	ac.SigningKeys.Add(publicKey(e.admin))
	if len(revs) > 0 {
		ac.Revocations = maps.Clone(revs)
	}
	return ac
}

// serverJWT returns the account JWT the server is to hold with revs:
// while closed, without the signing keys of agents and enrol
// credentials, so that it accepts none of them.
func (e *embeddedAccount) serverJWT(revs jwt.RevocationList) (string, error) {
	ac := e.claims(revs)
	if e.closed {
		ac.SigningKeys.Remove(publicKey(e.keys.agentSigner), publicKey(e.keys.enrolSigner))
	}
	return e.sign(ac)
}

// configure puts operator mode into the server's options.
func (e *embeddedAccount) configure(opts *server.Options) {
	opts.TrustedOperators = []*jwt.OperatorClaims{e.operator}
	opts.SystemAccount = e.keys.systemPub
	opts.AccountResolver = e.resolver
}

// setServer tells e the server it configured, once started.
func (e *embeddedAccount) setServer(s *server.Server) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.srv = s
}

// mustPush reports whether the server holds the account closed to
// agents, so that a push is due even when the revocations agree.
func (e *embeddedAccount) mustPush() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

// current returns the account as the server holds it, and starts
// keeping what addRevocations adds from now on, for apply. The authority
// calls it under its own lock, then apply; held is for other readers.
func (e *embeddedAccount) current(context.Context, *nats.Conn) (*jwt.AccountClaims, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.since = jwt.RevocationList{}
	return e.claims(e.revs), nil
}

// held returns the revocations the server holds.
func (e *embeddedAccount) held() jwt.RevocationList {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.revs)
}

func (e *embeddedAccount) sign(ac *jwt.AccountClaims) (string, error) {
	return ac.Encode(e.keys.operator)
}

func (e *embeddedAccount) save(token string) error {
	if err := fsutil.WriteFileAtomic(e.path, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("save the fleet account JWT: %w", err)
	}
	return nil
}

// apply gives this node's server the account with ac's revocations,
// opened to agents, before the push to the other nodes.
// Revocations added since current are added to ac's (and saved again),
// so that none is lost.
func (e *embeddedAccount) apply(ac *jwt.AccountClaims) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = false
	late := false
	for pub, at := range e.since {
		if at > ac.Revocations[pub] {
			if ac.Revocations == nil {
				ac.Revocations = jwt.RevocationList{}
			}
			ac.Revocations[pub] = at
			late = true
		}
	}
	e.since = nil
	if err := e.applyLocked(ac.Revocations); err != nil {
		return err
	}
	if late {
		token, err := e.sign(e.claims(ac.Revocations))
		if err == nil {
			err = e.save(token)
		}
		if err != nil {
			e.log.Warn("revocations from another node are held but not saved", "err", err)
		}
	}
	return nil
}

// applyLocked puts revs into the server's account, but for this
// gateway's own users' keys (keepOwn), which only a forged record or
// ledger entry names. e.mu is held.
func (e *embeddedAccount) applyLocked(revs jwt.RevocationList) error {
	if len(e.own) > 0 {
		revs = maps.Clone(revs)
		for k := range e.own {
			delete(revs, k)
		}
	}
	token, err := e.serverJWT(revs)
	if err != nil {
		return fmt.Errorf("sign the fleet account JWT: %w", err)
	}
	sac, err := jwt.DecodeAccountClaims(token)
	if err != nil {
		return fmt.Errorf("the fleet account JWT: %w", err)
	}
	// Should the server look the account up again, it finds this one.
	_ = e.resolver.Store(sac.Subject, token)
	if e.srv != nil {
		acc, err := e.srv.LookupAccount(sac.Subject)
		if err != nil {
			return fmt.Errorf("the embedded server's fleet account: %w", err)
		}
		e.srv.UpdateAccountClaims(acc, sac)
	}
	e.revs = maps.Clone(revs)
	return nil
}

// pushed: the other nodes took the revocations too; apply gave them to
// this node's server already.
func (e *embeddedAccount) pushed(*jwt.AccountClaims, string) {}

// mergeRevocations adds to this node's server the revocations of an
// account JWT another node pushed (token), if it is the fleet account's
// and signed by the operator, and only those of keys the revoked keys'
// ledger holds (held): everything else in it is ignored, so that
// whoever holds the operator key cannot shut out every user ("*"), the
// gateways' own users, or grow the JWT with junk. It returns how many
// entries were added or moved later.
func (e *embeddedAccount) mergeRevocations(token string, held func(string) (time.Time, bool)) (int, error) {
	ac, err := jwt.DecodeAccountClaims(token)
	if err != nil {
		return 0, err
	}
	if ac.Subject != e.keys.accountPub {
		return 0, fmt.Errorf("it is the JWT of account %s, not of the fleet account", ac.Subject)
	}
	if ac.Issuer != publicKey(e.keys.operator) {
		return 0, fmt.Errorf("it was signed by %s, not by the operator", ac.Issuer)
	}
	add := jwt.RevocationList{}
	for pub := range ac.Revocations {
		if at, ok := held(pub); ok {
			add[pub] = at.Unix()
		}
	}
	return e.addRevocations(add)
}

// keepOwn names this gateway's own users' keys, which addRevocations
// leaves alone.
func (e *embeddedAccount) keepOwn(pubs ...string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.own == nil {
		e.own = map[string]bool{}
	}
	for _, p := range pubs {
		e.own[p] = true
	}
}

// addRevocations adds revs (but this gateway's own users' keys) to this
// node's server and saves the account JWT; it returns how many entries
// were added or moved later.
func (e *embeddedAccount) addRevocations(add jwt.RevocationList) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	revs := maps.Clone(e.revs)
	if revs == nil {
		revs = jwt.RevocationList{}
	}
	added := 0
	for pub, at := range add {
		if e.own[pub] {
			e.log.Warn("a revocation of this gateway's own user is ignored (a forged entry of the revoked keys' ledger?)", "key", pub)
			continue
		}
		if at > revs[pub] {
			revs[pub] = at
			added++
			if e.since != nil {
				e.since[pub] = at
			}
		}
	}
	if added == 0 {
		return 0, nil
	}
	if err := e.applyLocked(revs); err != nil {
		return 0, err
	}
	if token, err := e.sign(e.claims(revs)); err == nil {
		if err := e.save(token); err != nil {
			e.log.Warn("revocations from another node are held but not saved", "err", err)
		}
	}
	return added, nil
}

// serveClaimUpdates answers, on the system connection sys, the account
// JWTs other nodes push for the fleet account
// ($SYS.REQ.ACCOUNT.<fleet>.CLAIMS.UPDATE), taking their revocations of
// keys held revoked (the ledger) only. Other accounts' updates are not
// served: no server takes them.
func (e *embeddedAccount) serveClaimUpdates(sys *nats.Conn, held func(string) (time.Time, bool)) (*nats.Subscription, error) {
	subject := fmt.Sprintf("$SYS.REQ.ACCOUNT.%s.CLAIMS.UPDATE", e.keys.accountPub)
	return sys.Subscribe(subject, func(m *nats.Msg) {
		resp := server.ServerAPIClaimUpdateResponse{}
		added, err := e.mergeRevocations(string(m.Data), held)
		if err != nil {
			e.log.Warn("a fleet account JWT pushed to NATS was refused: only the operator's, and only its revocations, are taken", "err", err)
			resp.Error = &server.ClaimUpdateError{Account: e.keys.accountPub, Code: 400, Description: "refused: " + err.Error()}
		} else {
			resp.Data = &server.ClaimUpdateStatus{Account: e.keys.accountPub, Code: 200, Message: fmt.Sprintf("revocations merged (%d added)", added)}
		}
		if m.Reply != "" {
			data, _ := json.Marshal(resp)
			_ = m.Respond(data)
		}
	})
}

// adminUser issues the JWT of a user of account, of any permissions,
// signed by its unscoped signing key signer, with a key made for this
// process only, and the options that connect with it.
func adminUser(name string, signer nkeys.KeyPair, account string) (nats.Option, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	token, err := userJWT(kp, name, signer, account)
	if err != nil {
		return nil, fmt.Errorf("%s user JWT: %w", name, err)
	}
	seed, _ := kp.Seed()
	return nats.UserJWTAndSeed(token, string(seed)), nil
}

// StreamAdmin returns how the gateway changes a protected stream, which
// its runtime user may not (runtimeDenied): as a user of the fleet
// account made for that one change and closed after it, signed by the
// signing key this process made and keeps in memory alone (no file in
// the data directory can sign such a user).
func (e *Embedded) StreamAdmin() jskv.Admin {
	key, account, ns := e.acct.admin, e.keys.accountPub, e.srv
	return func(ctx context.Context, do func(jetstream.JetStream) error) error {
		user, err := adminUser("fleet-gateway stream admin", key, account)
		if err != nil {
			return err
		}
		nc, err := nats.Connect("", nats.InProcessServer(ns), user, nats.Name("fleet-gateway stream admin"))
		if err != nil {
			return fmt.Errorf("connect as the stream admin: %w", err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		return do(js)
	}
}
