package gateway

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// streamAdmin returns how the gateway changes the protected stream
// named stream: on the embedded server as a user of the fleet account
// made for that one change and closed after it, signed by the signing
// key this process made and keeps in memory alone (no file in the data
// directory can sign such a user); on an external cluster with its own
// connection when its creds do not deny the update (creds made before
// the deny), else not at all (nil).
func (g *Gateway) streamAdmin(stream string) jskv.Admin {
	if g.conns.embedded != nil {
		return g.conns.embedded.StreamAdmin()
	}
	var deny []string
	if g.conns.external != nil {
		deny = g.conns.external.PubDeny()
	}
	if g.conns.nc == nil || jskv.DeniesSubject(deny, "$JS.API.STREAM.UPDATE."+stream) {
		return nil
	}
	nc := g.conns.nc
	return func(ctx context.Context, do func(jetstream.JetStream) error) error {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		return do(js)
	}
}

// auditStreamAdmin returns how the gateway updates the audit stream's
// configuration, which its runtime user may not (runtimeDenied): on the
// embedded server, as a user of the fleet account made for that one
// update and closed after it (streamAdmin); on an external cluster not
// at all (nil), the operator does it with an admin credential.
func (g *Gateway) auditStreamAdmin() audit.StreamUpdater {
	if g.conns.embedded == nil {
		return nil
	}
	admin := g.streamAdmin(protocol.AuditStream)
	return func(ctx context.Context, cfg jetstream.StreamConfig) error {
		return admin(ctx, func(js jetstream.JetStream) error {
			_, err := js.UpdateStream(ctx, cfg)
			return err
		})
	}
}
