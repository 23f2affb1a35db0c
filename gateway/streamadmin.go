package gateway

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/fleetmcp/fleetmcp/gateway/internal/jskv"
)

// streamAdmin returns how the gateway changes the protected stream
// named stream: on the embedded server as a user of the fleet account
// made for that one change and closed after it, signed by the signing
// key this process made and keeps in memory alone (no file in the data
// directory can sign such a user); on an external cluster with its own
// connection when its creds do not deny the update (creds made before
// the deny), else not at all (nil).
func (g *Gateway) streamAdmin(stream string) jskv.Admin {
	if g.ns != nil && g.streamSigner != nil {
		key, account, ns := g.streamSigner, g.accountPub, g.ns.Server
		return func(ctx context.Context, do func(jetstream.JetStream) error) error {
			user, err := adminUser("fleet-gateway stream admin", key, account)
			if err != nil {
				return err
			}
			nc, err := nats.Connect("", nats.InProcessServer(ns), user, nats.Name("fleet-gateway stream admin"))
			if err != nil {
				return fmt.Errorf("connect as the stream admin: %w", err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			return do(js)
		}
	}
	if g.nc == nil || jskv.DeniesSubject(g.natsPubDeny, "$JS.API.STREAM.UPDATE."+stream) {
		return nil
	}
	nc := g.nc
	return func(ctx context.Context, do func(jetstream.JetStream) error) error {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		return do(js)
	}
}
