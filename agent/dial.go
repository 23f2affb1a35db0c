package agent

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// dialLoop keeps one NATS session alive until ctx ends. nats.go reconnects
// by itself, but gives up for good after repeated authentication errors, so
// a closed connection is re-dialled here with jittered backoff. When NATS
// refuses the host its own subjects before the agent ever joined, the
// credential is another host's and re-dialling cannot help: dialLoop
// sends the reason on refused and returns.
func (a *Agent) dialLoop(ctx context.Context, refused chan<- error) {
	attempt, joined := 0, false
	for ctx.Err() == nil {
		a.maybeRecover(ctx, a.credentialState(nil))
		if a.stopping.Load() {
			<-ctx.Done()
			return
		}
		closed := make(chan struct{})
		a.lastDial.set("", nil)
		nc, err := a.connect(ctx, closed)
		if err == nil {
			a.lastDialFailure, a.recoverState = "", ""
			a.reachable(nc.ConnectedUrlRedacted())
			err = a.serve(ctx, nc, closed)
			if err == nil {
				attempt, joined = 0, true
				continue
			}
			var jr *JoinRefusedError
			if errors.As(err, &jr) && !joined {
				refused <- err
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		if revoked(err) {
			a.stop(&RevokedError{Host: a.cfg.Name, Err: err})
			<-ctx.Done()
			return
		}
		attempt++
		wait := reconnectDelay(attempt, a.cfg.ReconnectMin, a.cfg.ReconnectMax)
		if a.maybeRecover(ctx, a.credentialState(err)) {
			wait = 0 // dial at once with the recovered credential
		}
		if a.stopping.Load() {
			<-ctx.Done() // the reason is Run's to give
			return
		}
		a.logDialError(err, wait)
		select {
		case <-ctx.Done():
			return
		case <-a.redial: // the gateway gave other URLs
		case <-time.After(wait):
		}
	}
}

// logDialError says why NATS could not be used, and what to do when it
// refused the agent's credential. A reason is logged as a warning when
// it differs from the last attempt's, so an agent refused for hours does
// not fill its log; repeats are logged at debug level.
func (a *Agent) logDialError(err error, wait time.Duration) {
	in := wait.Round(time.Millisecond)
	reason, advice := dialFailure(err)
	if reason == reasonUnreachable {
		a.lastDialFailure = reason
		a.unreachable(err, wait)
		return
	}
	level := slog.LevelDebug
	if reason != a.lastDialFailure {
		level = slog.LevelWarn
		a.lastDialFailure = reason
	}
	if advice != "" {
		a.log.Log(context.Background(), level, reason+"; retrying", "err", err, "in", in, "what to do", advice)
		return
	}
	a.log.Log(context.Background(), level, reason+"; retrying", "err", err, "in", in)
}

// dialFailure classifies why a connection failed, with advice for the
// failures only the operator can fix.
func dialFailure(err error) (reason, advice string) {
	switch {
	case errors.Is(err, nats.ErrAuthExpired):
		return "NATS refused the agent: its credential expired",
			"enrol the host again (fleet-agent join) to get a new credential"
	case errors.Is(err, nats.ErrAuthorization):
		return "NATS refused the agent's credential",
			"the credential in the state directory is not one these servers accept: check --nats, or enrol the host with this fleet (fleet-agent join)"
	case errors.Is(err, nats.ErrPermissionViolation):
		return "NATS refused the agent its subjects", ""
	}
	return reasonUnreachable, ""
}

// reasonUnreachable: no NATS server could be reached (reach.go logs it).
const reasonUnreachable = "cannot reach NATS"

// reconnectDelay returns how long to wait before attempt (from 1) to
// reach NATS again: a uniformly random duration up to a ceiling that
// starts at lo and doubles with every attempt until it reaches hi ("full
// jitter"), so that a fleet cut off at once does not return at once.
func reconnectDelay(attempt int, lo, hi time.Duration) time.Duration {
	return rand.N(backoffCeiling(attempt, lo, hi) + 1)
}

// backoffCeiling returns the longest delay before attempt: lo doubled
// attempt-1 times, at most hi. lo is at least a millisecond.
func backoffCeiling(attempt int, lo, hi time.Duration) time.Duration {
	lo = max(lo, time.Millisecond)
	hi = max(hi, lo)
	c := lo
	for i := 1; i < attempt && c < hi; i++ {
		if c > hi/2 {
			return hi
		}
		c *= 2
	}
	return min(c, hi)
}

// connect dials NATS. It gives up as soon as ctx ends, even while a
// server is being dialled or has not finished its handshake.
func (a *Agent) connect(ctx context.Context, closed chan struct{}) (*nats.Conn, error) {
	d := &dialer{ctx: ctx, net: net.Dialer{Timeout: DialTimeout}, failed: a.lastDial.set}
	opts := []nats.Option{
		nats.Name("fleet-agent " + a.cfg.Name),
		nats.SetCustomDialer(d),
		nats.Timeout(HandshakeTimeout),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(func(attempts int) time.Duration {
			return reconnectDelay(attempts, a.cfg.ReconnectMin, a.cfg.ReconnectMax)
		}),
		nats.PingInterval(10 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.CustomInboxPrefix(protocol.AgentInboxPrefix(a.cfg.Name)),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if revoked(err) {
				a.stop(&RevokedError{Host: a.cfg.Name, Err: err})
				nc.Close()
				return
			}
			if err != nil {
				a.log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil && reasonOf(err) == reasonUnreachable {
				a.unreachable(err, 0)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			a.reachable(nc.ConnectedUrlRedacted())
			a.log.Info("NATS reconnected", "url", nc.ConnectedUrlRedacted())
			a.announce(nc, false)
			a.signalJoined()
			a.signalKeys()
			a.skillSync.poke() // a rollout may have come while it was away
		}),
		nats.ErrorHandler(func(nc *nats.Conn, _ *nats.Subscription, err error) {
			if revoked(err) {
				a.stop(&RevokedError{Host: a.cfg.Name, Err: err})
				nc.Close()
				return
			}
			a.log.Warn("NATS error", "err", err)
		}),
	}
	opts = append(opts, a.cfg.Credentials.natsOptions()...)
	opts = append(opts, a.cfg.NATSOptions...)
	nc, err := nats.Connect(joinURLs(a.currentServers()), opts...)
	d.connected()
	return nc, err
}
