package natsauth

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// The revocation loop keeps the NATS servers' revocations in step with
// the agent records, besides the pushes revocations make themselves: when
// the watch of the records sees a host turn revoked (revoked on another
// replica), when the system connection comes back (the server may have
// restarted with stale claims), when a push failed, when a spent token's
// enrol credential is due to go, and every reconcileEvery (pruning
// expired entries; an external server restarted while connected to
// another node).

const (
	reconcileEvery = time.Minute
	// ReconcileTimeout bounds one reconcile.
	ReconcileTimeout = 30 * time.Second
	// reconcileRetry is the wait after a failed reconcile.
	reconcileRetry = 5 * time.Second
)

// ReconcileSoon asks the revocation loop for a reconcile.
func (a *Authority) ReconcileSoon() {
	select {
	case a.reconcileCh <- struct{}{}:
	default:
	}
}

// ReconcileAt asks the revocation loop for a reconcile at t (a spent
// token's enrol credential is revoked once its retry window is over).
func (a *Authority) ReconcileAt(t time.Time) {
	a.reconcileMu.Lock()
	if a.reconcileDue.IsZero() || t.Before(a.reconcileDue) {
		a.reconcileDue = t
	}
	a.reconcileMu.Unlock()
	a.ReconcileSoon()
}

// nextReconcile returns how long the loop waits for its next reconcile:
// the periodic wait, or less when a reconcile is due sooner.
func (a *Authority) nextReconcile(periodic time.Duration) time.Duration {
	a.reconcileMu.Lock()
	defer a.reconcileMu.Unlock()
	if a.reconcileDue.IsZero() {
		return periodic
	}
	// A little after the time, so that the records say it is over.
	return max(0, min(periodic, a.reconcileDue.Sub(a.now())+100*time.Millisecond))
}

// reconciled clears the due time once a reconcile ran after it.
func (a *Authority) reconciled(ran time.Time) {
	a.reconcileMu.Lock()
	defer a.reconcileMu.Unlock()
	if !a.reconcileDue.IsZero() && !ran.Before(a.reconcileDue) {
		a.reconcileDue = time.Time{}
	}
}

// RevocationLoop reconciles on request (ReconcileSoon, ReconcileAt), when
// the system connection comes back and periodically, until ctx ends;
// log is where a failed reconcile is told.
func (a *Authority) RevocationLoop(ctx context.Context, log *slog.Logger) {
	reconnected := a.sys.StatusChanged(nats.CONNECTED)
	defer a.sys.RemoveStatusListener(reconnected)
	timer := time.NewTimer(jittered(reconcileEvery))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.reconcileCh:
		case <-reconnected:
		case <-timer.C:
		}
		ran := a.now()
		rctx, cancel := context.WithTimeout(ctx, ReconcileTimeout)
		err := a.Reconcile(rctx)
		cancel()
		next := jittered(reconcileEvery)
		if err != nil && ctx.Err() == nil {
			log.Warn("revocations not in step with the NATS servers yet; retrying", "err", err, "in", reconcileRetry)
			next = reconcileRetry
		} else if err == nil {
			a.reconciled(ran)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(a.nextReconcile(next))
	}
}
