package natsauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The revoker of an external NATS cluster (fleet-gateway nats-revoker).
// A full resolver takes whatever an operator signing key signs, so a
// gateway that holds one to revoke hosts could also re-sign the fleet
// account with a signing key of its own and mint a user that erases the
// audit trail. The revoker holds that key instead, beside the NATS
// servers, and does one thing with it: it adds to the fleet account's
// revocations keys the revoked keys' ledger holds (sealed entries only
// a gateway can write), and prunes, on its own, the entries of ledger
// keys once the last credential issued for them has expired (the
// ledger's entry says when; a key whose entry does not say is kept for
// ever). It never revokes the keys of its own users, which are the
// gateways' too.
// The gateways ask it on protocol.RevokerSubject; whoever holds a
// gateway's creds can ask it nothing more than to revoke a key revoked
// already.

// RevokerConfig configures RunRevoker.
type RevokerConfig struct {
	// NATSURLs are the cluster's servers.
	NATSURLs []string
	// CredsFile is a user of the fleet account (the gateways' creds
	// will do): the revoker takes requests and reads the ledger with it.
	CredsFile string
	// SystemCredsFile is a system account user, to look up and push the
	// fleet account JWT.
	SystemCredsFile string
	// OperatorSigningKeyFile is the seed of a signing key of the
	// cluster's operator, which re-signs the fleet account JWT.
	OperatorSigningKeyFile string
	// AgentSigningKeyFile is the seed of the agent signing key, from
	// which the seal of the ledger's entries is derived.
	AgentSigningKeyFile string
	// CAFile is the cluster's TLS CA when the system roots do not know
	// it.
	CAFile string
	Logger *slog.Logger
}

// ledgerLoadTimeout bounds one attempt to read the revoked keys'
// ledger whole.
const ledgerLoadTimeout = 2 * time.Minute

// revokerQueue is the queue group of the revokers.
const revokerQueue = "fleet-revoker"

// maxRevokerKeys bounds the keys of one request; maxClockSkew is how far
// ahead of the revoker's clock a revocation's time may be.
const (
	maxRevokerKeys = 10000
	maxClockSkew   = 5 * time.Minute
)

// revoker serves the gateways' requests.
type revoker struct {
	sys        *nats.Conn
	accountPub string
	signer     nkeys.KeyPair
	ledger     *revokedLedger
	own        map[string]bool // its users' keys (the gateways')
	log        *slog.Logger
	now        func() time.Time

	mu sync.Mutex // one change of the account JWT at a time
}

// RunRevoker serves revocation requests until ctx ends.
func RunRevoker(ctx context.Context, cfg RevokerConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	x, err := LoadExternal(ExternalConfig{CredsFile: cfg.CredsFile, AgentSigningKeyFile: cfg.AgentSigningKeyFile,
		OperatorSigningKeyFile: cfg.OperatorSigningKeyFile, CAFile: cfg.CAFile})
	if err != nil {
		return fmt.Errorf("revoker: %w", err)
	}
	if x.operatorSigner == nil {
		return errors.New("revoker: --nats_operator_signing_key is required: the revoker is what holds it")
	}
	url := strings.Join(cfg.NATSURLs, ",")
	common := []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(time.Second)}
	nc, err := nats.Connect(url, append(append(common, nats.Name("fleet-gateway nats-revoker")), x.Options(cfg.CredsFile)...)...)
	if err != nil {
		return fmt.Errorf("revoker: connect to NATS %s with --nats_creds: %w", url, err)
	}
	defer nc.Close()
	sys, err := nats.Connect(url, append(append(common, nats.Name("fleet-gateway nats-revoker system")), x.Options(cfg.SystemCredsFile)...)...)
	if err != nil {
		return fmt.Errorf("revoker: connect to NATS %s with --nats_system_creds: %w", url, err)
	}
	defer sys.Close()
	if err := x.Check(ctx, sys); err != nil {
		return fmt.Errorf("revoker: %w", err)
	}
	seal, err := newLedgerSeal(x.agentSigner)
	if err != nil {
		return err
	}
	var ledger *revokedLedger
	for {
		lctx, cancel := context.WithTimeout(ctx, ledgerLoadTimeout)
		ledger, err = openRevokedLedger(lctx, nc, seal, 0, log.With("component", "revoked-keys"), nil)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Warn("revoker: the revoked keys' ledger is not there yet (a gateway makes it at its first start); trying again", "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
	defer ledger.close()
	own := map[string]bool{}
	for _, f := range []string{cfg.CredsFile, cfg.SystemCredsFile} {
		if pub, err := credsUser(f); err == nil {
			own[pub] = true
		}
	}
	r := &revoker{sys: sys, accountPub: x.accountPub, signer: x.operatorSigner, ledger: ledger, own: own, log: log, now: time.Now}
	sub, err := nc.QueueSubscribe(protocol.RevokerSubject(), revokerQueue, r.serve)
	if err != nil {
		return fmt.Errorf("revoker: %w", err)
	}
	log.Info("revoker serving", "subject", protocol.RevokerSubject(), "account", x.accountPub)
	<-ctx.Done()
	_ = sub.Drain()
	return nil
}

func (r *revoker) serve(m *nats.Msg) {
	var req protocol.RevokerRequest
	ans := protocol.RevokerAnswer{}
	if err := json.Unmarshal(m.Data, &req); err != nil {
		ans.Error = "not a revocation request: " + err.Error()
	} else if n, err := r.revoke(req.Keys); err != nil {
		ans.Error = err.Error()
		r.log.Warn("revocation request refused", "err", err)
	} else {
		ans.Added = n
	}
	data, _ := json.Marshal(ans)
	_ = m.Respond(data)
}

// revoke adds keys to the fleet account's revocations, each of which
// the ledger must hold, and prunes the entries of ledger keys whose
// credentials have all expired.
func (r *revoker) revoke(keys map[string]int64) (int, error) {
	if len(keys) > maxRevokerKeys {
		return 0, fmt.Errorf("%d keys in one request, more than %d", len(keys), maxRevokerKeys)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*pushTimeout)
	defer cancel()
	now := r.now()
	caught := false
	for k, at := range keys {
		if !nkeys.IsValidPublicUserKey(k) {
			return 0, fmt.Errorf("%.60q is not a user key", k)
		}
		if r.own[k] {
			return 0, fmt.Errorf("key %s is the revoker's own user's, which the gateways share: it is not revoked this way", k)
		}
		if at > now.Add(maxClockSkew).Unix() {
			return 0, fmt.Errorf("key %s revoked from %s, a time to come", k, time.Unix(at, 0).UTC().Format(time.RFC3339))
		}
		if _, ok := r.ledger.revokedAt(k); !ok && !caught {
			// A gateway writes the ledger before it asks: read up to
			// the stream's last message, once a request.
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			_ = r.ledger.catchUp(cctx)
			ccancel()
			caught = true
		}
		if _, ok := r.ledger.revokedAt(k); !ok {
			return 0, fmt.Errorf("key %s is not in the revoked keys' ledger: only a gateway that revoked it may ask", k)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ac, err := lookupAccount(ctx, r.sys, r.accountPub)
	if err != nil {
		return 0, err
	}
	if ac.Revocations == nil {
		ac.Revocations = jwt.RevocationList{}
	}
	added, pruned := 0, 0
	for k, at := range keys {
		if at > ac.Revocations[k] {
			ac.Revocations[k] = at
			added++
		}
	}
	for k := range ac.Revocations {
		if _, asked := keys[k]; asked {
			continue
		}
		if until, ok := r.ledger.until(k); ok && !until.IsZero() && now.After(until) {
			delete(ac.Revocations, k)
			pruned++
		}
	}
	if added == 0 && pruned == 0 {
		return 0, nil
	}
	token, err := ac.Encode(r.signer)
	if err != nil {
		return 0, fmt.Errorf("sign the fleet account JWT: %w", err)
	}
	if err := pushClaims(ctx, r.sys, fmt.Sprintf("$SYS.REQ.ACCOUNT.%s.CLAIMS.UPDATE", r.accountPub), token); err != nil {
		return 0, fmt.Errorf("push the fleet account JWT: %w", err)
	}
	r.log.Info("fleet account revocations pushed", "added", added, "pruned", pruned, "revoked", len(ac.Revocations))
	return added, nil
}

// credsUser returns the public key of the user in a creds file.
func credsUser(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		return "", err
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return "", err
	}
	return uc.Subject, nil
}

// revokerAccount is the fleet account of an external cluster whose
// revoker holds the operator signing key: the gateway looks the account
// up and asks the revoker for what is missing.
type revokerAccount struct {
	accountPub string
	nc         *nats.Conn // a fleet account user, to ask the revoker
	sys        *nats.Conn // a system user, to look the account up
}

func (e *revokerAccount) current(ctx context.Context, sys *nats.Conn) (*jwt.AccountClaims, error) {
	return lookupAccount(ctx, sys, e.accountPub)
}

func (e *revokerAccount) sign(*jwt.AccountClaims) (string, error) {
	return "", errors.New("the gateway holds no operator signing key: its revoker signs")
}

func (e *revokerAccount) save(string) error                 { return nil }
func (e *revokerAccount) pushed(*jwt.AccountClaims, string) {}

// revoke asks the revoker for the revocations of ac the servers do not
// hold.
func (e *revokerAccount) revoke(ctx context.Context, ac *jwt.AccountClaims) error {
	cur, err := lookupAccount(ctx, e.sys, e.accountPub)
	if err != nil {
		return err
	}
	req := protocol.RevokerRequest{Keys: map[string]int64{}}
	for k, at := range ac.Revocations {
		if at > cur.Revocations[k] {
			req.Keys[k] = at
		}
	}
	if len(req.Keys) == 0 {
		return nil
	}
	data, _ := json.Marshal(req)
	rctx, cancel := context.WithTimeout(ctx, 2*pushTimeout+3*time.Second)
	defer cancel()
	msg, err := e.nc.RequestWithContext(rctx, protocol.RevokerSubject(), data)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("no revoker answers on %s: run fleet-gateway nats-revoker beside the NATS cluster, with the operator signing key (deploy/nats/README.md)", protocol.RevokerSubject())
	}
	if err != nil {
		return fmt.Errorf("ask the revoker: %w", err)
	}
	var ans protocol.RevokerAnswer
	if err := json.Unmarshal(msg.Data, &ans); err != nil {
		return fmt.Errorf("the revoker's answer %.200q: %w", msg.Data, err)
	}
	if ans.Error != "" {
		return fmt.Errorf("the revoker refused: %s", ans.Error)
	}
	return nil
}
