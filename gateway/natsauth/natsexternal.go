package natsauth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// An external NATS cluster runs in operator mode with a full account
// resolver, set up once with nsc or fleet-gateway nats-setup. The gateway
// connects with its own user's creds, pushes and looks up account JWTs
// with the system user's, issues agent credentials with the fleet
// account's scoped agent signing key, and re-signs the fleet account JWT
// with an operator signing key to change its revocations (and nothing
// else, so settings made with nsc survive).

// ExternalConfig names the files of an external cluster's setup.
type ExternalConfig struct {
	// CredsFile is the gateway's user's creds (--nats_creds).
	CredsFile string
	// AgentSigningKeyFile is the seed of the fleet account's scoped
	// agent signing key (--nats_agent_signing_key).
	AgentSigningKeyFile string
	// OperatorSigningKeyFile is the seed of a signing key of the
	// operator (--nats_operator_signing_key; empty: a revoker beside
	// the cluster holds it).
	OperatorSigningKeyFile string
	// CAFile is the cluster's TLS CA (--nats_ca; empty: the system's
	// roots).
	CAFile string
}

// External is what the gateway reads from the files of an external
// cluster's setup.
type External struct {
	accountPub     string
	agentSigner    nkeys.KeyPair
	operatorSigner nkeys.KeyPair
	caPEM          []byte
	tls            *tls.Config // nil: the system's roots
	// pubDeny is what the gateway's own user may not publish.
	pubDeny []string
}

// LoadExternal reads and checks the files of cfg.
func LoadExternal(cfg ExternalConfig) (*External, error) {
	x := &External{}
	data, err := os.ReadFile(cfg.CredsFile)
	if err != nil {
		return nil, fmt.Errorf("--nats_creds: %w", err)
	}
	token, err := jwt.ParseDecoratedJWT(data)
	if err != nil {
		return nil, fmt.Errorf("--nats_creds %s: %w", cfg.CredsFile, err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, fmt.Errorf("--nats_creds %s: not a user JWT: %w", cfg.CredsFile, err)
	}
	x.accountPub = uc.Issuer
	x.pubDeny = uc.Pub.Deny
	if uc.IssuerAccount != "" {
		x.accountPub = uc.IssuerAccount
	}
	if x.agentSigner, err = readSeedFile(cfg.AgentSigningKeyFile, nkeys.PrefixByteAccount, "agent signing key (--nats_agent_signing_key)"); err != nil {
		return nil, err
	}
	// Without it, a revoker beside the cluster holds it
	// (natsrevoker.go).
	if cfg.OperatorSigningKeyFile != "" {
		if x.operatorSigner, err = readSeedFile(cfg.OperatorSigningKeyFile, nkeys.PrefixByteOperator, "operator signing key (--nats_operator_signing_key)"); err != nil {
			return nil, err
		}
	}
	if cfg.CAFile != "" {
		if x.caPEM, err = os.ReadFile(cfg.CAFile); err != nil {
			return nil, fmt.Errorf("--nats_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(x.caPEM) {
			return nil, fmt.Errorf("--nats_ca %s holds no PEM certificate", cfg.CAFile)
		}
		x.tls = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return x, nil
}

// Options returns the connection options of a user whose creds are in
// file.
func (x *External) Options(file string) []nats.Option {
	opts := []nats.Option{nats.UserCredentials(file)}
	if x.tls != nil {
		opts = append(opts, nats.Secure(x.tls.Clone()))
	}
	return opts
}

// Check makes sure, through the system user's connection, that the
// cluster trusts the operator signing key, and that the agent signing
// key is a scoped key of the fleet account that gives agents their own
// subjects only. It gives up after a few pushes' time at most.
func (x *External) Check(ctx context.Context, sys *nats.Conn) error {
	ctx, cancel := context.WithTimeout(ctx, 3*pushTimeout)
	defer cancel()
	return x.check(ctx, sys)
}

func (x *External) check(ctx context.Context, sys *nats.Conn) error {
	op, err := trustedOperator(ctx, sys)
	if err != nil {
		return err
	}
	if x.operatorSigner != nil {
		signer := publicKey(x.operatorSigner)
		if signer != op.Subject && !slices.Contains(op.SigningKeys, signer) {
			return fmt.Errorf("--nats_operator_signing_key %s is not a signing key of the cluster's operator %s (%q): give a seed from nsc's keys for one of %v",
				signer, op.Subject, op.Name, op.SigningKeys)
		}
	}
	ac, err := lookupAccount(ctx, sys, x.accountPub)
	if err != nil {
		return err
	}
	signerPub := publicKey(x.agentSigner)
	scope, ok := ac.SigningKeys.GetScope(signerPub)
	us, scoped := scope.(*jwt.UserScope)
	switch {
	case !ok:
		return fmt.Errorf("--nats_agent_signing_key %s is not a signing key of the fleet account %s: add it as a scoped key with role %s (see deploy/nats/README.md)",
			signerPub, x.accountPub, protocol.AgentSigningRole)
	case !scoped || us == nil:
		return fmt.Errorf("--nats_agent_signing_key %s is an unscoped signing key of the fleet account: users it signs could do anything in the account. Make it a scoped key with the agent template (nsc edit signing-key --sk %s --role %s ..., see deploy/nats/README.md)",
			signerPub, signerPub, protocol.AgentSigningRole)
	case !slices.Equal(us.Template.Pub.Allow, protocol.AgentPublishTemplate()) || !slices.Equal(us.Template.Sub.Allow, protocol.AgentSubscribeTemplate()) ||
		len(us.Template.Pub.Deny) > 0 || len(us.Template.Sub.Deny) > 0:
		return fmt.Errorf("the template of agent signing key %s is not the agent permissions (publish %v, subscribe %v): it has publish %v, subscribe %v; fix it as deploy/nats/README.md shows",
			signerPub, protocol.AgentPublishTemplate(), protocol.AgentSubscribeTemplate(), us.Template.Pub.Allow, us.Template.Sub.Allow)
	case us.Template.Resp == nil || us.Template.Resp.MaxMsgs != -1:
		return fmt.Errorf("the template of agent signing key %s does not let agents answer a call with many messages (allow_responses max -1): streamed results would be cut short", signerPub)
	}
	return nil
}

// CAPEM returns the cluster's TLS CA (PEM) agents get; empty: the
// system's roots.
func (x *External) CAPEM() []byte { return x.caPEM }

// PubDeny returns what the gateway's own user may not publish (its
// creds' JWT).
func (x *External) PubDeny() []string { return x.pubDeny }

// Authority returns the authority of the external cluster's fleet
// account: it pushes revocations through sys (a system user) re-signed
// with the operator signing key, or without one asks the cluster's
// revoker on nc (a fleet account user). Credentials it issues are valid
// for ttl.
func (x *External) Authority(nc, sys *nats.Conn, ttl time.Duration, now func() time.Time, log *slog.Logger) *Authority {
	var src accountSource = &externalAccount{accountPub: x.accountPub, operatorSigner: x.operatorSigner}
	if x.operatorSigner == nil {
		// The revoker beside the cluster holds the operator signing key.
		src = &revokerAccount{accountPub: x.accountPub, nc: nc, sys: sys}
		log.Info("revocations go through the cluster's revoker (no --nats_operator_signing_key)", "subject", protocol.RevokerSubject())
		if _, err := nc.Request(protocol.RevokerSubject(), []byte(`{"keys":{}}`), pushTimeout); err != nil {
			log.Warn("no revoker answers: revoking a host fails until one does (fleet-gateway nats-revoker, see deploy/nats/README.md)",
				"subject", protocol.RevokerSubject(), "err", err)
		}
	}
	return &Authority{log: log.With("component", "nats-auth"), accountPub: x.accountPub, agentSigner: x.agentSigner,
		ttl: ttl, src: src, now: now, sys: sys, reconcileCh: make(chan struct{}, 1)}
}

// trustedOperator asks a server of the cluster which operator it trusts.
func trustedOperator(ctx context.Context, sys *nats.Conn) (*jwt.OperatorClaims, error) {
	rctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	msg, err := sys.RequestWithContext(rctx, "$SYS.REQ.SERVER.PING.VARZ", nil)
	if err != nil {
		return nil, fmt.Errorf("ask the NATS servers for their operator: %w", err)
	}
	var resp struct {
		Data  *server.Varz     `json:"data"`
		Error *server.ApiError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("ask the NATS servers for their operator: %w", err)
	}
	if resp.Error != nil || resp.Data == nil || len(resp.Data.TrustedOperatorsClaim) == 0 {
		return nil, errors.New("the NATS servers trust no operator: an external cluster must run in operator mode (see deploy/nats/README.md)")
	}
	return resp.Data.TrustedOperatorsClaim[0], nil
}

// externalAccount is the fleet account as the cluster holds it: looked
// up before each change, re-signed with the operator signing key.
type externalAccount struct {
	accountPub     string
	operatorSigner nkeys.KeyPair
}

func (e *externalAccount) current(ctx context.Context, sys *nats.Conn) (*jwt.AccountClaims, error) {
	return lookupAccount(ctx, sys, e.accountPub)
}

func (e *externalAccount) sign(ac *jwt.AccountClaims) (string, error) {
	return ac.Encode(e.operatorSigner)
}

func (e *externalAccount) save(string) error                 { return nil }
func (e *externalAccount) pushed(*jwt.AccountClaims, string) {}
