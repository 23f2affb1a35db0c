package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// An agent that cannot reach NATS says so, naming the URL it dialled and
// the error, with the next step, and keeps saying it with backoff (not
// once, then silence); an agent enrolled over the fleet API meanwhile
// asks the gateway for the NATS URLs to dial now (Locator), so that
// fixing the gateway's addresses brings every stuck host back without
// touching it. A host the fleet's operator revoked stops (RevokedError):
// no retry can help it, and the service manager must not restart it.

// Locator asks the gateway for the NATS URLs to dial now, stores them,
// and returns them and whether they differ from those stored before.
// agent/identity's Identity is one.
type Locator interface {
	Locate(ctx context.Context) (urls []string, changed bool, err error)
}

// Timing of the warnings about NATS out of reach and of the requests for
// current URLs: the first at once, then after a wait that doubles from
// the first value up to the second.
const (
	reachWarnFirst   = 30 * time.Second
	reachWarnMax     = 10 * time.Minute
	locateRetryFirst = 30 * time.Second
	locateRetryMax   = 15 * time.Minute
	locateWait       = 30 * time.Second
)

// DoctorAdvice is the next step for an agent that cannot reach NATS.
const DoctorAdvice = "run fleet-agent doctor on this host (it dials every URL and says why it fails); " +
	"a wrong URL is fixed on the gateway (--advertise, or --nats_advertise), and hosts enrolled over its fleet API ask it for the current URLs by themselves"

// reachLog decides which failures to reach NATS are logged as warnings:
// the first of a run of failures, then with a pause that doubles from
// reachWarnFirst up to reachWarnMax; the others at debug level.
type reachLog struct {
	mu      sync.Mutex
	failing bool
	since   time.Time
	next    time.Time
	pause   time.Duration
}

// failed records a failure at now and reports whether it is to be a
// warning, and since when NATS has been out of reach.
func (r *reachLog) failed(now time.Time) (warn bool, since time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.failing {
		r.failing, r.since, r.pause, r.next = true, now, reachWarnFirst, now.Add(reachWarnFirst)
		return true, now
	}
	if now.Before(r.next) {
		return false, r.since
	}
	r.pause = min(2*r.pause, reachWarnMax)
	r.next = now.Add(r.pause)
	return true, r.since
}

// ok ends a run of failures; it reports whether there was one.
func (r *reachLog) ok() (bool, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	was, since := r.failing, r.since
	r.failing = false
	return was, since
}

// lastDial is the last dial of a NATS server that failed.
type lastDial struct {
	mu   sync.Mutex
	addr string
	err  error
}

func (l *lastDial) set(addr string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.addr, l.err = addr, err
}

func (l *lastDial) get() (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addr, l.err
}

// currentServers returns the NATS URLs dialled now.
func (a *Agent) currentServers() []string {
	if p := a.servers.Load(); p != nil {
		return *p
	}
	return a.cfg.Servers
}

// urlOf returns the URL among the servers whose host:port is addr, or
// addr.
func urlOf(servers []string, addr string) string {
	for _, s := range servers {
		full := s
		if !strings.Contains(full, "://") {
			full = "nats://" + full
		}
		if u, err := url.Parse(full); err == nil {
			port := u.Port()
			if port == "" {
				port = "4222"
			}
			if net.JoinHostPort(u.Hostname(), port) == addr || u.Host == addr {
				return u.Redacted()
			}
		}
	}
	return addr
}

// unreachable logs a failure to reach NATS (err; wait: the time to the
// next attempt, 0 when nats.go retries by itself) and wakes the locate
// loop.
func (a *Agent) unreachable(err error, wait time.Duration) {
	servers := a.currentServers()
	where := strings.Join(servers, ",")
	cause := err
	if addr, derr := a.lastDial.get(); addr != "" && derr != nil {
		where, cause = urlOf(servers, addr), derr
	}
	warn, since := a.reach.failed(time.Now())
	level := slog.LevelDebug
	if warn {
		level = slog.LevelWarn
	}
	attrs := []any{"url", where, "err", cause}
	if wait > 0 {
		attrs = append(attrs, "in", wait.Round(time.Millisecond))
	}
	if d := time.Since(since); d >= time.Second {
		attrs = append(attrs, "out_of_reach_for", d.Round(time.Second))
	}
	attrs = append(attrs, "next_step", DoctorAdvice)
	a.log.Log(context.Background(), level, "cannot reach NATS at "+where+" ("+cause.Error()+"); retrying", attrs...)
	a.pokeLocate()
}

// reachable ends a run of failures to reach NATS.
func (a *Agent) reachable(url string) {
	a.lastDial.set("", nil)
	if was, since := a.reach.ok(); was {
		a.log.Info("NATS reachable again", "url", url, "after", time.Since(since).Round(time.Second))
	}
}

func (a *Agent) pokeLocate() {
	select {
	case a.locatePoke <- struct{}{}:
	default:
	}
}

// locateLoop asks the gateway for the NATS URLs to dial now whenever NATS
// is out of reach, at most once per backoff step, and makes dialLoop dial
// the new ones. It returns when ctx ends, or when the gateway says the
// host is revoked.
func (a *Agent) locateLoop(ctx context.Context) {
	loc := a.cfg.Locator
	failures := 0
	var nextAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.locatePoke:
		}
		if time.Now().Before(nextAt) {
			continue
		}
		if nc := a.nc.Load(); nc != nil && nc.IsConnected() {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, locateWait)
		old := a.currentServers()
		urls, changed, err := loc.Locate(lctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil && changed && !slices.Equal(urls, old) {
			failures, nextAt = 0, time.Time{}
			a.servers.Store(&urls)
			a.log.Warn("the gateway gave other NATS URLs than this host had: dialling those (stored in the enrolment)", "old", strings.Join(old, ","), "new", strings.Join(urls, ","))
			a.lastDial.set("", nil)
			if nc := a.nc.Load(); nc != nil && !nc.IsConnected() {
				nc.Close() // nats.go's own reconnects know only the old URLs
			}
			select {
			case a.redial <- struct{}{}:
			default:
			}
			continue
		}
		if revoked(err) {
			a.stop(&RevokedError{Host: a.cfg.Name, Err: err})
			return
		}
		failures++
		wait := renewRetryDelay(failures, locateRetryFirst, rand.Float64())
		wait = min(wait, locateRetryMax)
		nextAt = time.Now().Add(wait)
		if err != nil {
			a.log.Warn("cannot ask the gateway's fleet API for the current NATS URLs", "err", err, "again_in", wait.Round(time.Second))
		} else {
			a.log.Debug("the gateway gives the NATS URLs this host dials: the servers are down or out of reach", "urls", strings.Join(urls, ","))
		}
	}
}

// RevokedError: the fleet's operator revoked this host (or its key). No
// retry can help; the agent stops. fleet-agent exits with a status of its
// own for it (ExitRevoked), which its service units do not restart.
type RevokedError struct {
	Host string
	Err  error // what said so: NATS, or the gateway's answer
}

func (e *RevokedError) Error() string {
	// Only what said so: the advice of a refusal would be a second one.
	cause := fmt.Sprint(e.Err)
	var apiErr *protocol.APIError
	if errors.As(e.Err, &apiErr) {
		cause = "the gateway answered " + string(apiErr.Code)
	}
	return fmt.Sprintf("host %s was revoked by the fleet's operator (%s): the agent stops and is not restarted. "+
		"To enrol this machine again, the operator makes a token with fleetctl token create --replace %s, and this machine joins with it (fleet-agent join --name %s ...)",
		e.Host, cause, e.Host, e.Host)
}

func (e *RevokedError) Unwrap() error { return e.Err }

// ExitRevoked is the exit status of fleet-agent for a revoked host
// (sysexits' EX_NOPERM). The service units name it in
// RestartPreventExitStatus=.
const ExitRevoked = 77

// revoked reports whether err says the host or its key was revoked: NATS
// closed the connection as revoked, or the gateway refused a request so.
func revoked(err error) bool {
	if err == nil {
		return false
	}
	var apiErr *protocol.APIError
	if errors.As(err, &apiErr) {
		return apiErr.Code == protocol.APIHostRevoked || apiErr.Code == protocol.APIKeyRevoked
	}
	return errors.Is(err, nats.ErrAuthRevoked)
}

// stop makes Run stop with err (the first reason given wins).
func (a *Agent) stop(err error) {
	a.stopping.Store(true)
	select {
	case a.fatal <- err:
	default:
	}
}
