package natsauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file is the fleet's NATS identity authority. NATS runs in
// operator mode: the fleet account (FLEET) holds the gateways and the
// agents, and a scoped signing key of that account issues one user JWT
// per agent, named after its host, for the public key the agent generated
// itself. The key's template (protocol.AgentPublishTemplate and friends)
// gives each agent its own subjects only; the JWTs it signs carry no
// permissions of their own, and are not bearer tokens: the agent signs
// the server's nonce with its seed on every connect.
//
// Revoking an agent adds its key to the fleet account JWT's revocations
// (covering every JWT issued for it up to then) and pushes the re-signed
// account JWT to $SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE: every server
// closes the agent's connections at once and refuses it from then on.
// Revocations are derived from the gateway's agent records, which keep
// every revoked key for ever, so that replicas agree and a server that
// restarted with stale claims is brought back in line.

const (
	// fleetAccountName and systemAccountName name the accounts in their
	// JWTs (for people reading them; NATS knows accounts by key).
	fleetAccountName  = "FLEET"
	systemAccountName = "SYS"
	operatorName      = "fleetmcp"

	// pushTimeout bounds one claims push or lookup; pushAttempts are made
	// before a push fails.
	pushTimeout  = 3 * time.Second
	pushAttempts = 3
	// PruneSlack is how long after the last credential issued for a
	// revoked key expires its revocation entry is kept.
	PruneSlack = 5 * time.Minute
	// reconcileRounds bounds the pushes of one reconcile: more are needed
	// only while other replicas keep revoking.
	reconcileRounds = 5
)

// accountSource is where the fleet account JWT comes from and how it is
// re-signed: built by the gateway for its embedded server, looked up from
// an external cluster's servers.
type accountSource interface {
	// current returns the account claims the servers hold now.
	current(ctx context.Context, sys *nats.Conn) (*jwt.AccountClaims, error)
	// sign encodes claims, signed by the operator (or a signing key of
	// it).
	sign(ac *jwt.AccountClaims) (string, error)
	// save keeps token before it is pushed (embedded: for the next
	// start); pushed records that the servers accepted it.
	save(token string) error
	pushed(ac *jwt.AccountClaims, token string)
}

// RevokedKey is one revoked agent key: when it was revoked and until
// when credentials issued for it are valid at the latest.
type RevokedKey struct {
	Pub       string
	RevokedAt time.Time
	Expires   time.Time
	// Exact: Expires is when the last credential of the key expires (an
	// enrol credential), not only the record's latest agent credential.
	Exact bool
	// until is when its last credential expires, for the ledger (zero:
	// not known; set by keepRevoked).
	until time.Time
}

// KeySource is what the authority needs of the agent records (and of
// the join tokens, whose enrol credentials are revoked too).
type KeySource interface {
	// RevokedKeys returns, as of now, every key revoked in the records.
	RevokedKeys(ctx context.Context) ([]RevokedKey, error)
}

// KeySources are several sources of revoked keys, as one.
type KeySources []KeySource

// RevokedKeys returns the revoked keys of every source.
func (s KeySources) RevokedKeys(ctx context.Context) ([]RevokedKey, error) {
	var out []RevokedKey
	for _, r := range s {
		keys, err := r.RevokedKeys(ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, keys...)
	}
	return out, nil
}

// Authority issues agent credentials and keeps the fleet account's
// revocations in step with the agent records.
type Authority struct {
	log         *slog.Logger
	accountPub  string
	agentSigner nkeys.KeyPair
	// enrolSigner is the fleet account's scoped enrol signing key, which
	// issues the enrol credentials of NATS join tokens; nil on an
	// external cluster (its setup has no such key).
	enrolSigner nkeys.KeyPair
	// ttl is how long an agent credential is valid.
	ttl time.Duration
	src accountSource
	now func() time.Time

	// sys is the system user's connection, for pushes and lookups, set
	// once at start; records are the agent records and join tokens
	// (setRecords).
	sys *nats.Conn

	mu      sync.Mutex // one reconcile at a time; guards records
	records KeySource
	// ledger holds every key ever revoked (revokedledger.go), set by
	// OpenLedger; no credential is issued for a key in it.
	ledger *revokedLedger
	// emb is the embedded server's account (nil: an external cluster).
	emb *embeddedAccount

	// heldMu guards held, the revocations the servers held at the last
	// reconcile or push of this gateway. No credential is issued for a
	// key in it: the account JWT is signed by the operator, so no user
	// of the fleet account can take an entry out, whatever the records
	// say (a record put back from before its host was revoked).
	heldMu sync.Mutex
	held   jwt.RevocationList

	// reconcileCh asks the revocation loop for a reconcile;
	// reconcileDue is when one is next due besides the periodic one
	// (zero: none), set by ReconcileAt.
	reconcileCh  chan struct{}
	reconcileMu  sync.Mutex
	reconcileDue time.Time

	// connzPage is how many connections a server lists per answer
	// (0: the constant connzPage; tests make it small).
	connzPage int
}

// ErrKeyRevoked: the key was revoked; no credential is ever issued
// for it again.
var ErrKeyRevoked = errors.New("key revoked")

// errKeyInRevocations: the fleet account's revocations hold the key.
// It is an ErrKeyRevoked.
var errKeyInRevocations = fmt.Errorf("%w in the fleet account", ErrKeyRevoked)

// AccountPub returns the fleet account's public key.
func (a *Authority) AccountPub() string { return a.accountPub }

// AgentSigner returns the fleet account's scoped agent signing key,
// which issues the agents' credentials; the gateways derive the seal of
// their records from it.
func (a *Authority) AgentSigner() nkeys.KeyPair { return a.agentSigner }

// AgentSignerPub returns the public key of the agent signing key: the
// issuer of every agent credential.
func (a *Authority) AgentSignerPub() string { return publicKey(a.agentSigner) }

// CheckIssuable refuses a key the servers hold revoked, or that the
// revoked keys' ledger holds (an ErrKeyRevoked).
func (a *Authority) CheckIssuable(userPub string) error {
	a.heldMu.Lock()
	at, ok := a.held[userPub]
	ledger := a.ledger
	a.heldMu.Unlock()
	if !ok && ledger != nil {
		if since, found := ledger.revokedAt(userPub); found {
			return fmt.Errorf("%w: key %s was revoked %s (the revoked keys' ledger holds it), whatever its host's record says; no credential is issued for it again (the agent must make a new key)",
				ErrKeyRevoked, userPub, since.Format(time.RFC3339))
		}
	}
	if ok {
		return fmt.Errorf("%w: the NATS servers hold key %s revoked since %s, whatever its host's record says; no credential is issued for it again (the agent must make a new key)",
			errKeyInRevocations, userPub, time.Unix(at, 0).UTC().Format(time.RFC3339))
	}
	return nil
}

// setHeld records revs as what the servers hold.
func (a *Authority) setHeld(revs jwt.RevocationList) {
	a.heldMu.Lock()
	a.held = maps.Clone(revs)
	a.heldMu.Unlock()
}

// SetRecords sets where the revoked keys come from: the agent records,
// and the join tokens once they are open.
func (a *Authority) SetRecords(r KeySource) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.records = r
}

// OpenLedger opens the revoked keys' ledger on nc (creating its stream
// with replicas when there is none) and reads it whole; from then on no
// credential is issued for a key it holds. On the embedded server, the
// keys it holds that were revoked after recent (a credential issued
// before could still be valid), and those other gateways add from then
// on, are held revoked by this node's server too: it may have missed a
// revocation by key while down, which no record names. Close closes it.
func (a *Authority) OpenLedger(ctx context.Context, nc *nats.Conn, replicas int, recent time.Time, log *slog.Logger) error {
	seal, err := newLedgerSeal(a.agentSigner)
	if err != nil {
		return err
	}
	var added func(string, time.Time)
	if e := a.emb; e != nil {
		added = func(key string, at time.Time) {
			if at.After(recent) {
				if _, err := e.addRevocations(jwt.RevocationList{key: at.Unix()}); err != nil {
					e.log.Warn("a revoked key from the ledger is not held by this node's server yet", "key", key, "err", err)
				}
			}
		}
	}
	ledger, err := openRevokedLedger(ctx, nc, seal, replicas, log, added)
	if err != nil {
		return err
	}
	a.heldMu.Lock()
	a.ledger = ledger
	a.heldMu.Unlock()
	if a.emb != nil {
		held := jwt.RevocationList{}
		for k, at := range ledger.since(recent) {
			held[k] = at.Unix()
		}
		if _, err := a.emb.addRevocations(held); err != nil {
			return fmt.Errorf("revoked keys: %w", err)
		}
	}
	return nil
}

// Close stops following the revoked keys' ledger.
func (a *Authority) Close() {
	a.heldMu.Lock()
	ledger := a.ledger
	a.heldMu.Unlock()
	if ledger != nil {
		ledger.close()
	}
}

// LedgerRevokedAt reports whether the revoked keys' ledger holds pub,
// and since when (false before the ledger is open).
func (a *Authority) LedgerRevokedAt(pub string) (time.Time, bool) {
	a.heldMu.Lock()
	ledger := a.ledger
	a.heldMu.Unlock()
	if ledger == nil {
		return time.Time{}, false
	}
	return ledger.revokedAt(pub)
}

// keepRevoked records keys in the ledger, each with when its last
// credential expires (a key revoked by hand, expires unknown: never). A
// failure is returned after the push goes on, so that the caller tries
// again: the other nodes take only keys their ledger holds.
func (a *Authority) keepRevoked(ctx context.Context, keys []RevokedKey) error {
	a.heldMu.Lock()
	ledger := a.ledger
	a.heldMu.Unlock()
	if ledger == nil {
		return nil
	}
	for i, k := range keys {
		if k.Expires.IsZero() && !k.Exact {
			continue
		}
		until := k.RevokedAt.Add(a.ttl)
		if k.Exact || k.Expires.After(until) {
			until = k.Expires
		}
		keys[i].until = until.Add(PruneSlack)
	}
	if err := ledger.record(ctx, keys); err != nil {
		a.log.Warn("revoked keys not recorded in the ledger yet; retrying", "err", err)
		return err
	}
	return nil
}

// AgentJWT issues the user JWT of host's agent for its public key
// userPub, valid until expires.
func (a *Authority) AgentJWT(host, userPub string, expires time.Time) (string, error) {
	if err := protocol.ValidateHost(host); err != nil {
		return "", err
	}
	if !nkeys.IsValidPublicUserKey(userPub) {
		return "", fmt.Errorf("%q is not an nkey user public key (U...)", userPub)
	}
	if err := a.CheckIssuable(userPub); err != nil {
		return "", fmt.Errorf("issue the credential of %s: %w", host, err)
	}
	uc := jwt.NewUserClaims(userPub)
	uc.Name = host
	uc.IssuerAccount = a.accountPub
	uc.Expires = expires.Unix()
	// A scoped signing key's users carry no permissions or limits of
	// their own: the scope's template gives them.
	uc.UserPermissionLimits = jwt.UserPermissionLimits{}
	token, err := uc.Encode(a.agentSigner)
	if err != nil {
		return "", fmt.Errorf("issue the credential of %s: %w", host, err)
	}
	return token, nil
}

// EnrolJWT issues the enrol credential of join token tokenID for the
// throw-away key userPub, valid until expires.
func (a *Authority) EnrolJWT(tokenID, userPub string, expires time.Time) (string, error) {
	if a.enrolSigner == nil {
		return "", errors.New("enrolment over NATS needs the fleet account's enrol signing key, which the gateway holds only for its embedded NATS server (not with --nats_url)")
	}
	if err := protocol.CheckTokenID(tokenID); err != nil {
		return "", err
	}
	uc := jwt.NewUserClaims(userPub)
	uc.Name = "enrol-" + tokenID
	uc.Expires = expires.Unix()
	uc.IssuerAccount = a.accountPub
	// The enrol signing key's template (enrolScope) gives the token's
	// own subjects, from this tag, and the limits.
	uc.Tags.Add(enrolTokenTag + ":" + tokenID)
	uc.UserPermissionLimits = jwt.UserPermissionLimits{}
	token, err := uc.Encode(a.enrolSigner)
	if err != nil {
		return "", fmt.Errorf("issue the enrol credential of join token %s: %w", tokenID, err)
	}
	return token, nil
}

// Revoke brings the account's revocations in step with the agent
// records and checks that they cover userPubs: the records, not this
// call, say what is revoked, so the caller records the revocation first.
func (a *Authority) Revoke(ctx context.Context, userPubs ...string) error {
	revs, err := a.reconcile(ctx)
	if err != nil {
		return err
	}
	for _, pub := range userPubs {
		if _, ok := revs[pub]; !ok {
			return fmt.Errorf("key %s is not revoked in the agent records (or its credentials have all expired)", pub)
		}
	}
	return nil
}

// RevokeKeys puts userPubs into the account's revocations as of at,
// whatever the agent records say, and pushes them: for keys that a
// record which cannot be trusted (forged, damaged, missing, an old copy)
// does not name as revoked. Reconciles leave an entry the records know
// nothing of alone, and prune it only once a record says the key is
// revoked and every credential issued for it has expired, so it stays.
func (a *Authority) RevokeKeys(ctx context.Context, at time.Time, userPubs ...string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	ac, err := a.src.current(ctx, a.sys)
	if err != nil {
		return fmt.Errorf("revocations: %w", err)
	}
	if ac.Revocations == nil {
		ac.Revocations = jwt.RevocationList{}
	}
	changed := false
	var keep []RevokedKey
	for _, pub := range userPubs {
		if !nkeys.IsValidPublicUserKey(pub) {
			return fmt.Errorf("revoke %q: not an nkey user public key (U...)", pub)
		}
		keep = append(keep, RevokedKey{Pub: pub, RevokedAt: at})
		if ac.Revocations[pub] < at.Unix() {
			ac.Revocations[pub] = at.Unix()
			changed = true
		}
	}
	ledgerErr := a.keepRevoked(ctx, keep)
	if !changed {
		a.setHeld(ac.Revocations)
		return ledgerErr
	}
	if err := a.push(ctx, ac); err != nil {
		return err
	}
	a.log.Info("fleet account revocations pushed", "revoked", len(ac.Revocations), "added", len(userPubs), "keys", userPubs)
	return ledgerErr
}

// HeldRevocations returns the fleet account's revocations as the
// servers hold them now: each revoked key, with the Unix time from which
// its credentials are refused.
func (a *Authority) HeldRevocations(ctx context.Context) (map[string]int64, error) {
	if e, ok := a.src.(interface{ held() jwt.RevocationList }); ok {
		return e.held(), nil
	}
	ac, err := a.src.current(ctx, a.sys)
	if err != nil {
		return nil, fmt.Errorf("revocations: %w", err)
	}
	return ac.Revocations, nil
}

// Reconcile rebuilds the account's revocations from the agent records
// and pushes the account JWT if the servers' differ.
func (a *Authority) Reconcile(ctx context.Context) error {
	_, err := a.reconcile(ctx)
	return err
}

// reconcile pushes the revocations the records call for until the
// servers hold them, and returns them. Each round reads the records
// again after a push: when another replica revoked a key at the same
// time, its push may have crossed this one, and the next round pushes
// the union.
func (a *Authority) reconcile(ctx context.Context) (jwt.RevocationList, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.records == nil {
		return nil, errors.New("revocations: the agent records are not open yet")
	}
	for range reconcileRounds {
		revoked, err := a.records.RevokedKeys(ctx)
		if err != nil {
			return nil, fmt.Errorf("revocations: %w", err)
		}
		if err := a.keepRevoked(ctx, revoked); err != nil {
			return nil, fmt.Errorf("revocations: %w", err)
		}
		ac, err := a.src.current(ctx, a.sys)
		if err != nil {
			return nil, fmt.Errorf("revocations: %w", err)
		}
		want := a.revocations(ac.Revocations, revoked)
		held := maps.Equal(ac.Revocations, want) || len(ac.Revocations) == 0 && len(want) == 0
		if _, ok := a.src.(delegatedSource); ok {
			// The revoker prunes on its own: what counts is that every
			// revocation wanted is held.
			held = covers(ac.Revocations, want)
		}
		if p, ok := a.src.(interface{ mustPush() bool }); held && (!ok || !p.mustPush()) {
			a.setHeld(want)
			return want, nil
		}
		added, removed := diffRevocations(ac.Revocations, want)
		ac.Revocations = want
		if err := a.push(ctx, ac); err != nil {
			return nil, err
		}
		a.log.Info("fleet account revocations pushed", "revoked", len(want), "added", added, "pruned", removed)
	}
	return nil, fmt.Errorf("revocations: still changing after %d pushes (other gateways revoking at the same time?); retrying later", reconcileRounds)
}

// revocations returns the revocation list the records call for: cur
// with every revoked key added at the second it was revoked, and without
// the keys whose credentials have all expired (with PruneSlack to spare).
// Entries the records know nothing of (made by hand with nsc, say) are
// left alone: the gateway never lifts a revocation it cannot account for.
func (a *Authority) revocations(cur jwt.RevocationList, revoked []RevokedKey) jwt.RevocationList {
	now := a.now()
	want := maps.Clone(cur)
	if want == nil {
		want = jwt.RevocationList{}
	}
	for _, k := range revoked {
		until := k.RevokedAt.Add(a.ttl)
		if k.Exact || k.Expires.After(until) {
			until = k.Expires
		}
		if now.After(until.Add(PruneSlack)) {
			delete(want, k.Pub) // every credential issued for the key has expired
			continue
		}
		if at := k.RevokedAt.Unix(); at > want[k.Pub] {
			want[k.Pub] = at
		}
	}
	return want
}

// delegatedSource is an account source whose revocations another
// process pushes (the revoker of an external cluster, natsrevoker.go):
// revoke asks it to add those of ac the servers do not hold.
type delegatedSource interface {
	revoke(ctx context.Context, ac *jwt.AccountClaims) error
}

// covers reports whether have holds every revocation of want, as late.
func covers(have, want jwt.RevocationList) bool {
	for k, at := range want {
		if have[k] < at {
			return false
		}
	}
	return true
}

func diffRevocations(old, now jwt.RevocationList) (added, removed int) {
	for k := range now {
		if _, ok := old[k]; !ok {
			added++
		}
	}
	for k := range old {
		if _, ok := now[k]; !ok {
			removed++
		}
	}
	return added, removed
}

// push signs ac and sends it to the servers, retrying a few times while
// they do not answer.
func (a *Authority) push(ctx context.Context, ac *jwt.AccountClaims) error {
	if d, ok := a.src.(delegatedSource); ok {
		// A revoker holds the operator signing key: it adds what is
		// missing, and prunes on its own.
		if err := d.revoke(ctx, ac); err != nil {
			return err
		}
		a.setHeld(ac.Revocations)
		return nil
	}
	token, err := a.src.sign(ac)
	if err != nil {
		return fmt.Errorf("sign the fleet account JWT: %w", err)
	}
	if n := len(token); n > maxAccountJWT {
		a.log.Warn("the fleet account JWT is large; revoked agents' entries are pruned once their credentials expire",
			"bytes", n, "revocations", len(ac.Revocations))
	}
	if err := a.src.save(token); err != nil {
		return err
	}
	// The embedded server takes account changes from its own gateway
	// alone, in process; the push carries them to the other nodes.
	if l, ok := a.src.(interface {
		apply(*jwt.AccountClaims) error
	}); ok {
		if err := l.apply(ac); err != nil {
			return err
		}
	}
	subject := fmt.Sprintf("$SYS.REQ.ACCOUNT.%s.CLAIMS.UPDATE", a.accountPub)
	var lastErr error
	for attempt := 1; attempt <= pushAttempts; attempt++ {
		if lastErr = a.pushOnce(ctx, subject, token); lastErr == nil {
			a.src.pushed(ac, token)
			a.setHeld(ac.Revocations)
			return nil
		}
		var refused *claimsRefusedError
		if errors.As(lastErr, &refused) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
		}
	}
	return fmt.Errorf("push the fleet account JWT: %w", lastErr)
}

// maxAccountJWT is the size beyond which the account JWT is reported as
// large: NATS carries it in one message (max_payload, 1 MiB by default).
const maxAccountJWT = 512 << 10

// claimsRefusedError is a server's refusal of a pushed account JWT.
type claimsRefusedError struct{ msg string }

func (e *claimsRefusedError) Error() string { return "the NATS server refused it: " + e.msg }

func (a *Authority) pushOnce(ctx context.Context, subject, token string) error {
	return pushClaims(ctx, a.sys, subject, token)
}

// pushClaims sends an account JWT to the servers on subject as the
// system user sys, and returns their refusal if they refuse it.
func pushClaims(ctx context.Context, sys *nats.Conn, subject, token string) error {
	rctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	msg, err := sys.RequestWithContext(rctx, subject, []byte(token))
	if err != nil {
		return err
	}
	var resp server.ServerAPIClaimUpdateResponse
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("unreadable answer %.200q: %w", msg.Data, err)
	}
	if resp.Error != nil {
		return &claimsRefusedError{msg: strings.TrimSpace(resp.Error.Description)}
	}
	return nil
}

// lookupAccount asks the servers for the account JWT they hold.
func lookupAccount(ctx context.Context, sys *nats.Conn, accountPub string) (*jwt.AccountClaims, error) {
	subject := fmt.Sprintf("$SYS.REQ.ACCOUNT.%s.CLAIMS.LOOKUP", accountPub)
	var lastErr error
	for attempt := 1; attempt <= pushAttempts; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, pushTimeout)
		msg, err := sys.RequestWithContext(rctx, subject, nil)
		cancel()
		if err == nil {
			if len(msg.Data) == 0 {
				return nil, fmt.Errorf("the NATS servers do not know the fleet account %s: preload its JWT (resolver_preload, see fleet-gateway nats-setup)", accountPub)
			}
			ac, err := jwt.DecodeAccountClaims(string(msg.Data))
			if err != nil {
				return nil, fmt.Errorf("the fleet account JWT the servers hold does not decode: %w", err)
			}
			if ac.Subject != accountPub {
				return nil, fmt.Errorf("the servers answered with the JWT of account %s, not %s", ac.Subject, accountPub)
			}
			return ac, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("look up the fleet account JWT: %w", lastErr)
}
