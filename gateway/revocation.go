package gateway

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"
)

// The revocation loop keeps the NATS servers' revocations in step with
// the agent records, besides the pushes RevokeAgent makes itself: when
// the watch of the records sees a host turn revoked (revoked on another
// replica), when the system connection comes back (the server may have
// restarted with stale claims), when a push failed, when a spent token's
// enrol credential is due to go, and every reconcileEvery (pruning
// expired entries; an external server restarted while connected to
// another node).

const (
	reconcileEvery   = time.Minute
	reconcileTimeout = 30 * time.Second
	// reconcileRetry is the wait after a failed reconcile.
	reconcileRetry = 5 * time.Second
)

// reconcileSoon asks the revocation loop for a reconcile.
func (g *Gateway) reconcileSoon() {
	select {
	case g.reconcileCh <- struct{}{}:
	default:
	}
}

// reconcileAt asks the revocation loop for a reconcile at t (a spent
// token's enrol credential is revoked once its retry window is over).
func (g *Gateway) reconcileAt(t time.Time) {
	g.reconcileMu.Lock()
	if g.reconcileDue.IsZero() || t.Before(g.reconcileDue) {
		g.reconcileDue = t
	}
	g.reconcileMu.Unlock()
	g.reconcileSoon()
}

// nextReconcile returns how long the loop waits for its next reconcile:
// the periodic wait, or less when a reconcile is due sooner.
func (g *Gateway) nextReconcile(periodic time.Duration) time.Duration {
	g.reconcileMu.Lock()
	defer g.reconcileMu.Unlock()
	if g.reconcileDue.IsZero() {
		return periodic
	}
	// A little after the time, so that the records say it is over.
	return max(0, min(periodic, g.reconcileDue.Sub(g.now())+100*time.Millisecond))
}

// reconciled clears the due time once a reconcile ran after it.
func (g *Gateway) reconciled(ran time.Time) {
	g.reconcileMu.Lock()
	defer g.reconcileMu.Unlock()
	if !g.reconcileDue.IsZero() && !ran.Before(g.reconcileDue) {
		g.reconcileDue = time.Time{}
	}
}

// revocationLoop reconciles on request, on reconnect and periodically,
// until ctx ends.
func (g *Gateway) revocationLoop(ctx context.Context) {
	reconnected := g.sys.StatusChanged(nats.CONNECTED)
	defer g.sys.RemoveStatusListener(reconnected)
	timer := time.NewTimer(jittered(reconcileEvery))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.reconcileCh:
		case <-reconnected:
		case <-timer.C:
		}
		ran := g.now()
		rctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
		err := g.authority.Reconcile(rctx)
		cancel()
		next := jittered(reconcileEvery)
		if err != nil && ctx.Err() == nil {
			g.log.Warn("revocations not in step with the NATS servers yet; retrying", "err", err, "in", reconcileRetry)
			next = reconcileRetry
		} else if err == nil {
			g.reconciled(ran)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(g.nextReconcile(next))
	}
}

// jittered returns d plus up to a tenth more.
func jittered(d time.Duration) time.Duration { return d + rand.N(d/10+1) }
