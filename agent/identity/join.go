package identity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/fleetmcp/fleetmcp/agent/statelock"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// JoinOptions are what fleet-agent join is given.
type JoinOptions struct {
	// GatewayURL is the gateway's fleet API, https://HOST[:PORT].
	GatewayURL string
	// NATSURL, instead of GatewayURL, enrols over NATS: the NATS server,
	// tls://HOST:PORT, and Token a NATS join token (fleetctl token create
	// --nats).
	NATSURL string
	// Token is the join token (fleetctl token create).
	Token string
	// CAPin is the pin of the fleet's CA (sha256:...): the only thing
	// that makes the gateway's certificate trusted.
	CAPin string
	// Host is the name the agent asks for; empty: the one the token
	// gives (the gateway refuses an empty name when the token gives only
	// a pattern).
	Host string
	// StateDir is the agent's state directory.
	StateDir string
	// Lock, when set, is the lock on StateDir the caller holds (and
	// keeps: fleet-agent join passes it on to the agent it runs). Nil:
	// Join takes the lock itself for as long as it writes.
	Lock *statelock.Lock
	// Facts are reported to the gateway; the zero value: this machine's
	// (Facts()).
	Facts protocol.AgentFacts
	// Now returns the time the request is dated with (default time.Now).
	Now func() time.Time
	// RetryFor is how long a join keeps asking while the gateway answers
	// that it cannot serve now (a NATS leader election, its storage
	// briefly away): default DefaultJoinRetry; negative, not at all.
	RetryFor time.Duration
	// Say, when set, hears what the join decided beyond enrolling (an
	// identity found dead and replaced).
	Say func(msg string)
}

// TokenIDFile, in the identity directory, names the join token the agent
// enrolled with: the same join again sends nothing; a join with another
// token first asks the gateway whether the identity still holds.
const TokenIDFile = "token.id"

// DefaultJoinRetry is how long a join asks again while the gateway is
// unavailable: longer than a cluster's leader elections take.
const DefaultJoinRetry = time.Minute

func (o *JoinOptions) retryFor() time.Duration {
	if o.RetryFor == 0 {
		return DefaultJoinRetry
	}
	return max(o.RetryFor, 0)
}

// CheckJoinOptions checks the options of a join but the state directory
// (which an installer chooses later), so that a bad one is refused before
// anything is made or dialled.
func CheckJoinOptions(o *JoinOptions) error {
	_, err := o.check()
	return err
}

// validate checks every option; it returns the gateway URL in the form
// enrolment.json keeps.
func (o *JoinOptions) validate() (string, error) {
	gw, err := o.check()
	if o.StateDir == "" {
		err = errors.Join(err, errors.New("no state directory: set --state_dir"))
	}
	return gw, err
}

// check checks every option but the state directory. An enrolment over
// NATS keeps no gateway URL ("").
func (o *JoinOptions) check() (string, error) {
	var errs []error
	var gw string
	var err error
	switch {
	case o.NATSURL != "" && o.GatewayURL != "":
		errs = append(errs, errors.New("--gateway and --nats both given for the join: a NATS join token (fleetctl token create --nats) enrols over NATS, drop --gateway; a plain one over the fleet API, drop --nats"))
	case o.NATSURL != "":
		if _, err := ParseNATSEnrolURL(o.NATSURL); err != nil {
			errs = append(errs, fmt.Errorf("--nats: %w", err))
		}
		if _, err := protocol.ParseNATSJoinToken(o.Token); err != nil {
			errs = append(errs, fmt.Errorf("--token: %w (enrolment over NATS takes the token of fleetctl token create --nats)", err))
		}
	default:
		if gw, err = ParseGatewayURL(o.GatewayURL); err != nil {
			errs = append(errs, fmt.Errorf("--gateway: %w", err))
		}
		if protocol.IsNATSJoinToken(o.Token) {
			errs = append(errs, errors.New("--token is a NATS join token: enrol over NATS with --nats tls://HOST:PORT (as fleetctl token create --nats prints it), not --gateway"))
		} else if _, _, err := protocol.ParseJoinToken(o.Token); err != nil {
			errs = append(errs, fmt.Errorf("--token: %w", err))
		}
	}
	if !protocol.ValidCAPin(o.CAPin) {
		errs = append(errs, fmt.Errorf("--ca_pin %q: want sha256: and 64 lowercase hex digits, as fleetctl token create prints it", protocol.Ellipsis(o.CAPin, 80)))
	}
	if o.Host != "" {
		if err := protocol.ValidateHost(o.Host); err != nil {
			errs = append(errs, fmt.Errorf("--name: %w", err))
		}
	}
	return gw, errors.Join(errs...)
}

// Join enrols the agent of opts.StateDir with the gateway and returns its
// identity, and whether it enrolled now: an agent enrolled already with
// this gateway and CA (and, when opts.Host is set, under that name) sends
// nothing and keeps its identity. An agent enrolled with another gateway
// is refused: moving a host to another fleet is a deliberate act.
//
// Join makes the agent's key when the state directory has none (the seed
// never leaves the host), dials the gateway with its CA pinned (the token
// is sent only to a server that proves it holds a certificate of that
// CA), proves possession of the key, and stores the credential and the
// enrolment. A refusal is a *RefusedError that says what to do.
//
// Everything from the key to the enrolment is written under the state
// directory's lock (opts.Lock, or one Join takes): a second join or an
// agent on the same directory meanwhile gets a *statelock.InUseError, and
// the key, credential and enrolment always belong together. A join that
// finds the machine enrolled already writes nothing and needs no lock (an
// installed agent may be running).
func Join(ctx context.Context, opts JoinOptions) (*Identity, bool, error) {
	gw, err := opts.validate()
	if err != nil {
		return nil, false, err
	}
	found, done, err := opts.enrolled(gw)
	if done && (err != nil || !opts.newToken(found)) {
		return found, false, err
	}
	lock := opts.Lock
	if lock == nil {
		if lock, err = statelock.Acquire(opts.StateDir); err != nil {
			var inUse *statelock.InUseError
			if found != nil && errors.As(err, &inUse) {
				// An agent runs on this identity (an installed
				// service): it stays, and the token is not used.
				opts.say(fmt.Sprintf("an agent runs on %s (%v): its identity as %q is kept and the new token not used; to re-enrol, stop it first", opts.StateDir, err, found.Enrolment.Host))
				return found, false, nil
			}
			return nil, false, fmt.Errorf("join: %w", err)
		}
		defer lock.Release()
	} else if !lock.Holds(opts.StateDir) {
		return nil, false, fmt.Errorf("join: the state directory lock given is on %s, not on %s", lock.Dir(), opts.StateDir)
	}
	// Again under the lock: another join may have finished meanwhile.
	if id, done, err := opts.enrolled(gw); done {
		if err != nil || !opts.newToken(id) {
			return id, false, err
		}
		dead, err := holds(ctx, id)
		if err != nil {
			return id, false, err
		}
		if dead == nil {
			// The identity holds: this token is not for it, and the
			// same join again need not ask.
			if err := Open(opts.StateDir).write(TokenIDFile, []byte(opts.tokenID()+"\n")); err != nil {
				return nil, false, fmt.Errorf("join: %w", err)
			}
			return id, false, nil
		}
		// The gateway no longer knows this identity (the host revoked,
		// its name taken over, its record deleted): the token enrols
		// the host again, under its name, with a new key.
		if opts.Host == "" {
			opts.Host = id.Enrolment.Host
		}
		if err := Open(opts.StateDir).RemoveKey(); err != nil {
			return nil, false, fmt.Errorf("join: remove the identity the gateway refused: %w", err)
		}
		opts.say(fmt.Sprintf("the gateway refused the identity of %s (host %q, key %s): %v; enrolling it again with the token and a new key", opts.StateDir, id.Enrolment.Host, id.PublicKey, dead))
	}
	return opts.enrol(ctx, gw)
}

// enrol sends the enrolment request with the host's key (made now if the
// state directory has none) and stores the gateway's answer, for Join.
func (o *JoinOptions) enrol(ctx context.Context, gw string) (*Identity, bool, error) {
	send, closeSend, token, err := o.enroller(ctx)
	if err != nil {
		return nil, false, err
	}
	defer closeSend()
	store := Open(o.StateDir)
	kp, err := store.LoadOrCreateKey()
	if err != nil {
		return nil, false, err
	}
	defer kp.Wipe()
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	facts := o.Facts
	if facts == (protocol.AgentFacts{}) {
		facts = Facts()
	}
	req := &protocol.EnrolRequest{Token: token, Host: o.Host, CAPin: o.CAPin, Facts: facts}
	var resp protocol.EnrolResponse
	err = retryUnavailable(ctx, o.retryFor(), func() error {
		// Each attempt is a new request: a new nonce, the time now.
		if err := prove(kp, req, &req.Proof, now()); err != nil {
			return err
		}
		return send(ctx, req, &resp)
	})
	if err != nil {
		return nil, false, err
	}
	if o.Host != "" && resp.Host != o.Host {
		return nil, false, fmt.Errorf("enrolment: asked for host %q, the gateway enrolled %q: refusing a name not asked for", o.Host, resp.Host)
	}
	if err := store.saveAnswer(gw, o.CAPin, req.PublicKey, &resp, now()); err != nil {
		return nil, false, fmt.Errorf("enrolment: %w", err)
	}
	if tokenID := o.tokenID(); tokenID != "" {
		if err := store.write(TokenIDFile, []byte(tokenID+"\n")); err != nil {
			return nil, false, fmt.Errorf("enrolment: %w", err)
		}
	}
	id, err := Load(o.StateDir)
	if err != nil {
		return nil, false, fmt.Errorf("enrolment stored, but it does not load: %w", err)
	}
	return id, true, nil
}

// enrolled looks at the identity in the state directory: done with an
// identity when the agent is enrolled with this gateway already, done
// with an error when it is enrolled elsewhere or its key is damaged, not
// done when an enrolment is to be made (no identity, or only part of
// one, or a credential that does not fit a good key).
func (o *JoinOptions) enrolled(gw string) (*Identity, bool, error) {
	id, err := Load(o.StateDir)
	switch {
	case err == nil:
		if err := id.sameEnrolment(gw, o.CAPin, o.Host, o.StateDir); err != nil {
			return nil, true, err
		}
		return id, true, nil
	case errors.Is(err, ErrNotEnrolled):
		return nil, false, nil
	}
	// A damaged key is the operator's to restore or delete; a credential
	// or enrolment that does not fit a good key is what a new enrolment
	// replaces.
	if _, kerr := Open(o.StateDir).LoadKey(); kerr != nil {
		return nil, true, err
	}
	return nil, false, nil
}

func (o *JoinOptions) say(msg string) {
	if o.Say != nil {
		o.Say(msg)
	}
}

// tokenID is the id of the join token over the fleet API ("" for one
// over NATS, or a malformed one).
func (o *JoinOptions) tokenID() string {
	if o.NATSURL != "" {
		return ""
	}
	id, _, err := protocol.ParseJoinToken(o.Token)
	if err != nil {
		return ""
	}
	return id
}

// newToken reports whether the join brings another token than the one
// the identity id enrolled with (over the fleet API): then the gateway is
// asked whether the identity still holds before the token is left
// unused.
func (o *JoinOptions) newToken(id *Identity) bool {
	tokenID := o.tokenID()
	if tokenID == "" || id.Enrolment.GatewayURL == "" {
		return false
	}
	data, err := os.ReadFile(filepath.Join(id.store.Dir(), TokenIDFile))
	return err != nil || strings.TrimSpace(string(data)) != tokenID
}

// holds asks the gateway, with the identity's own key (a recovery
// request), whether it still knows the identity. It returns the refusal
// when the gateway does not (the host revoked, the name held by another
// key, no record), nil when it does (recovery not allowed, or allowed and
// done: the identity then holds a new credential), and an error when it
// could not tell.
func holds(ctx context.Context, id *Identity) (dead error, err error) {
	rerr := id.Recover(ctx)
	var refusal *RefusedError
	switch {
	case rerr == nil:
		return nil, nil
	case errors.As(rerr, &refusal):
		switch refusal.API.Code {
		case protocol.APINoRecovery:
			return nil, nil
		case protocol.APIHostRevoked, protocol.APIKeyRevoked, protocol.APIUnknownHost, protocol.APIForbidden:
			return refusal.API, nil
		}
	}
	return nil, fmt.Errorf("join: the agent of %s is enrolled as %q, and the join brings a new token; asking the gateway whether that enrolment still holds failed: %w (the token was not used: try again)",
		id.store.Dir(), id.Enrolment.Host, rerr)
}

// enroller connects to the gateway the options name, over HTTPS or NATS,
// with the CA pinned, and returns how to send the enrolment request, how
// to close the connection, and the join token the request carries.
func (o *JoinOptions) enroller(ctx context.Context) (func(context.Context, *protocol.EnrolRequest, *protocol.EnrolResponse) error, func(), string, error) {
	if o.NATSURL == "" {
		client, err := newAPIClient(o.GatewayURL, o.CAPin)
		if err != nil {
			return nil, nil, "", err
		}
		send := func(ctx context.Context, req *protocol.EnrolRequest, resp *protocol.EnrolResponse) error {
			return client.post(ctx, "enrolment", protocol.EnrolPath, req, resp)
		}
		return send, client.close, strings.TrimSpace(o.Token), nil
	}
	u, err := ParseNATSEnrolURL(o.NATSURL)
	if err != nil {
		return nil, nil, "", err
	}
	nt, err := protocol.ParseNATSJoinToken(o.Token)
	if err != nil {
		return nil, nil, "", err
	}
	e, err := dialNATSEnrol(ctx, u, o.CAPin, nt)
	if err != nil {
		return nil, nil, "", err
	}
	return e.enrol, e.close, nt.Token, nil
}

// sameEnrolment checks that an agent enrolled already is enrolled with
// the gateway and CA a join names, under the name it asks for.
func (id *Identity) sameEnrolment(gw, pin, host, stateDir string) error {
	e := &id.Enrolment
	if e.GatewayURL != gw || e.CAPin != pin {
		if gw == "" {
			gw = "a gateway over NATS"
		}
		where := e.GatewayURL
		if where == "" {
			where = "a gateway over NATS or in process (dev mode)"
		}
		return fmt.Errorf("the agent of state directory %s is enrolled as %q with %s (CA %s), not with %s (CA %s): to move this host to another fleet, delete %s (it leaves its fleet) and join again, or give the second fleet's agent its own --state_dir",
			stateDir, e.Host, where, e.CAPin, gw, pin, id.store.Dir())
	}
	if host != "" && host != e.Host {
		return fmt.Errorf("--name %s: the agent of state directory %s is enrolled as %q with this gateway; drop --name, or give a host of another name its own --state_dir",
			host, stateDir, e.Host)
	}
	return nil
}

// saveAnswer checks the gateway's answer to an enrolment or recovery of
// the key pub and stores it: the credential, then the enrolment.
func (s *Store) saveAnswer(gw, pin, pub string, resp *protocol.EnrolResponse, now time.Time) error {
	if err := protocol.ValidateHost(resp.Host); err != nil {
		return fmt.Errorf("the gateway's answer names host %q: %w", resp.Host, err)
	}
	uc, err := checkCredential(resp.JWT, pub, resp.Host)
	if err != nil {
		return fmt.Errorf("the gateway's answer: %w", err)
	}
	expires := resp.Expires
	if uc.Expires > 0 {
		expires = time.Unix(uc.Expires, 0).UTC()
	}
	e := &Enrolment{Host: resp.Host, GatewayURL: gw, CAPin: pin, NATSURLs: resp.NATSURLs, NATSCA: resp.NATSCA,
		Labels: resp.Labels, SigningKeys: resp.SigningKeys, SigningKeySerial: resp.SigningKeySerial, EnrolledAt: now.UTC().Truncate(time.Second), Expires: expires}
	if err := e.validate(); err != nil {
		return fmt.Errorf("the gateway's answer: %w", err)
	}
	if err := s.SaveJWT(resp.JWT); err != nil {
		return err
	}
	return s.SaveEnrolment(e)
}

// Facts returns what the agent reports about this machine when it enrols.
func Facts() protocol.AgentFacts {
	host, _ := os.Hostname()
	return protocol.AgentFacts{OS: runtime.GOOS, Arch: runtime.GOARCH, Hostname: host, Kernel: kernelRelease()}
}
