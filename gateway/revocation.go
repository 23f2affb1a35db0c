package gateway

import "time"

// reconcileSoon asks the revocation loop (natsauth.Authority.RevocationLoop)
// for a reconcile.
func (g *Gateway) reconcileSoon() { g.subsys.authority.ReconcileSoon() }

// reconcileAt asks the revocation loop for a reconcile at t (a spent
// token's enrol credential is revoked once its retry window is over).
func (g *Gateway) reconcileAt(t time.Time) { g.subsys.authority.ReconcileAt(t) }
