package agent

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// Renewer keeps the agent's credential current: agent/identity's
// Identity is one. An agent without one (in the gateway's process, in
// tests) neither renews nor recovers its credential.
type Renewer interface {
	// Validity returns when the current credential was issued and when
	// it expires (zero: never).
	Validity() (issued, expires time.Time)
	// Renew asks the gateway, with request (a request over the agent's
	// NATS connection), for a new credential, and makes it the current
	// one. A refusal wraps a *protocol.APIError.
	Renew(ctx context.Context, request func(ctx context.Context, subject string, data []byte) ([]byte, error)) error
	// Recover asks the gateway's fleet API for a new credential when
	// the current one has expired or NATS refuses it. A refusal wraps a
	// *protocol.APIError (protocol.APINoRecovery when the operator
	// allowed none).
	Recover(ctx context.Context) error
}

// Timing of renewals: a credential is renewed once less than a third of
// its lifetime is left (ten days of the default thirty), checked at every
// connect and about hourly; a refused or unanswered renewal is retried
// with backoff from renewRetryMin up to renewRetryMax (reconnects do not
// hurry it), so a gateway that is down for a while is not asked by the
// whole fleet at once. The gateway renews only past half the lifetime
// (protocol.APITooEarly before) and a few times an hour per host
// (protocol.APIRateLimited): a third left is a sixth of the lifetime
// (five days of thirty) of clock skew inside the first, and an agent
// whose clock is further ahead is refused, keeps its credential and
// succeeds at a later retry.
const (
	renewCheckEvery    = time.Hour
	renewRetryMin      = time.Minute
	renewRetryMax      = time.Hour
	renewRequestWait   = 10 * time.Second
	recoverRequestWait = 60 * time.Second
	recoverRetryEvery  = time.Hour
	// renewUnknownLifetime is when a credential that does not say when
	// it was issued is renewed: this long before it expires.
	renewUnknownLifetime = 10 * 24 * time.Hour
)

// renewAt returns when a credential valid from issued to expires is due
// for renewal: when a third of its lifetime is left. The zero time: it
// never expires.
func renewAt(issued, expires time.Time) time.Time {
	if expires.IsZero() {
		return time.Time{}
	}
	life := expires.Sub(issued)
	if issued.IsZero() || life <= 0 {
		return expires.Add(-renewUnknownLifetime)
	}
	return expires.Add(-life / 3)
}

// renewCheckDelay returns how long the renewal loop waits, at now, before
// it looks at the credential again: about renewCheckEvery (jittered by
// r, from 0 to 1, between three quarters and five quarters of it), and no
// longer than until the credential is due.
func renewCheckDelay(now, issued, expires time.Time, r float64) time.Duration {
	d := time.Duration(float64(renewCheckEvery) * (0.75 + r/2))
	if at := renewAt(issued, expires); !at.IsZero() {
		d = min(d, at.Sub(now))
	}
	return max(d, time.Second)
}

// renewRetryDelay returns how long to wait after failures (from 1)
// renewals in a row: a random moment (r, from 0 to 1) in the upper half
// of a ceiling that doubles from lo up to renewRetryMax.
func renewRetryDelay(failures int, lo time.Duration, r float64) time.Duration {
	c := backoffCeiling(failures, lo, max(lo, renewRetryMax))
	return c/2 + time.Duration(r*float64(c/2))
}

// renewLoop renews the agent's credential over its NATS connection when
// it is due: looked at whenever the agent (re)joins the fleet and about
// hourly. It never ends the agent; it returns when ctx ends.
func (a *Agent) renewLoop(ctx context.Context) {
	r := a.cfg.Renewer
	timer := time.NewTimer(renewCheckEvery)
	defer timer.Stop()
	failures := 0
	// retryAt is when a failed renewal may be tried again: a reconnect
	// before then does not hurry it, so an agent that reconnects often
	// asks no more often than its backoff (the gateway bounds each
	// host's renewals, and refuses them before half the credential's
	// life, when this agent's clock runs ahead of the gateway's).
	var retryAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.joined:
			if time.Now().Before(retryAt) {
				continue
			}
		case <-timer.C:
		}
		now := time.Now()
		issued, expires := r.Validity()
		if at := renewAt(issued, expires); at.IsZero() || now.Before(at) {
			timer.Reset(renewCheckDelay(now, issued, expires, rand.Float64()))
			continue
		}
		nc := a.nc.Load()
		if nc == nil || !nc.IsConnected() {
			continue // the next join looks again
		}
		err := r.Renew(ctx, requestOn(nc))
		if ctx.Err() != nil {
			return
		}
		if revoked(err) {
			a.stop(&RevokedError{Host: a.cfg.Name, Err: err})
			return
		}
		if err != nil {
			failures++
			wait := renewRetryDelay(failures, a.renewRetry, rand.Float64())
			a.log.Warn("credential renewal failed; the agent keeps its credential and retries",
				"err", err, "expires", expires, "in", wait.Round(time.Second))
			timer.Reset(wait)
			retryAt = time.Now().Add(wait)
			continue
		}
		failures, retryAt = 0, time.Time{}
		issued, expires = r.Validity()
		a.log.Info("credential renewed: the next connection uses it", "expires", expires)
		timer.Reset(renewCheckDelay(time.Now(), issued, expires, rand.Float64()))
	}
}

// requestOn returns a request over nc, bounded by renewRequestWait.
func requestOn(nc *nats.Conn) func(context.Context, string, []byte) ([]byte, error) {
	return func(ctx context.Context, subject string, data []byte) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, renewRequestWait)
		defer cancel()
		msg, err := nc.RequestWithContext(ctx, subject, data)
		if err != nil {
			return nil, err
		}
		return msg.Data, nil
	}
}

// signalJoined wakes the renewal loop after a (re)connect.
func (a *Agent) signalJoined() {
	select {
	case a.joined <- struct{}{}:
	default:
	}
}

// Credential states in which the agent asks for a recovery, once per
// state (recoverState).
const (
	credExpired = "the credential has expired"
	credRefused = "NATS refused the credential"
)

// credentialState returns the state of the agent's credential that a
// recovery may fix after the connection failed with err (nil: before a
// dial): "" when there is none.
func (a *Agent) credentialState(err error) string {
	if a.cfg.Renewer == nil {
		return ""
	}
	if _, expires := a.cfg.Renewer.Validity(); !expires.IsZero() && !time.Now().Before(expires) {
		return credExpired
	}
	switch {
	case errors.Is(err, nats.ErrAuthExpired):
		return credExpired
	case errors.Is(err, nats.ErrAuthorization):
		return credRefused
	}
	return ""
}

// maybeRecover asks the gateway for a new credential when the state of
// the agent's credential calls for it and the agent has not asked since
// that state began (a successful connection ends it) or for
// recoverRetryEvery (so that a recovery the operator allows later is
// taken without a restart), and reports whether it got one. Owned by
// dialLoop.
func (a *Agent) maybeRecover(ctx context.Context, state string) bool {
	if state == "" || state == a.recoverState && time.Since(a.recoverAsked) < recoverRetryEvery {
		return false
	}
	a.recoverState, a.recoverAsked = state, time.Now()
	ctx, cancel := context.WithTimeout(ctx, recoverRequestWait)
	defer cancel()
	a.log.Warn(state+": asking the gateway for a recovery", "gateway API", "POST "+protocol.RecoverPath)
	err := a.cfg.Renewer.Recover(ctx)
	var apiErr *protocol.APIError
	switch {
	case err == nil:
		_, expires := a.cfg.Renewer.Validity()
		a.log.Info("credential recovered", "expires", expires)
		return true
	case revoked(err):
		a.stop(&RevokedError{Host: a.cfg.Name, Err: err})
	case errors.As(err, &apiErr) && apiErr.Code == protocol.APINoRecovery:
		a.log.Error("recovery not allowed: run fleet-agent join with a new token", "err", err)
	default:
		a.log.Error("credential recovery failed; the agent keeps trying to connect", "err", err)
	}
	return false
}
