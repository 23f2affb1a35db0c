package gateway

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// The embedded gateway's own users (made at each start) may not delete,
// update, purge or restore the buckets of the join tokens and agent
// records, nor the audit stream; after the attempts the streams are there
// with their creation time, and the gateway still sweeps its tokens.
func TestProtectedStreamsRefuseRuntimeUsers(t *testing.T) {
	gw := startAPIGateway(t, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// (The gateway's host connection is the same user.)
	for _, conn := range []struct {
		name string
		nc   *nats.Conn
	}{{"the gateway's connection", gw.conns.nc}} {
		for _, stream := range []string{protocol.AuditStream, "KV_" + protocol.TokensBucket, "KV_" + protocol.AgentsBucket, "FLEET_REVOKED"} {
			before := streamCreated(t, gw.conns.nc, stream)
			for _, op := range []string{"DELETE", "UPDATE", "PURGE", "RESTORE", "MSG.DELETE", "PEER.REMOVE"} {
				subj := "$JS.API.STREAM." + op + "." + stream
				body := []byte(`{}`)
				if op == "UPDATE" || op == "RESTORE" {
					body = []byte(`{"name":"` + stream + `","config":{"name":"` + stream + `"}}`)
				}
				rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
				msg, err := conn.nc.RequestWithContext(rctx, subj, body)
				rcancel()
				if err == nil && !strings.Contains(string(msg.Data), `"error"`) {
					t.Errorf("as %s, %s was carried out: %s", conn.name, subj, msg.Data)
				}
			}
			if after := streamCreated(t, gw.conns.nc, stream); !after.Equal(before) {
				t.Errorf("%s: created %s, was %s", stream, after, before)
			}
		}
	}
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	if _, err := gw.subsys.enrol.SweepTokens(sctx, time.Now()); err != nil {
		t.Errorf("token sweep: %v", err)
	}
}

// streamCreated returns when stream was made, as nc reads it.
func streamCreated(t *testing.T, nc *nats.Conn, stream string) time.Time {
	t.Helper()
	msg, err := nc.Request("$JS.API.STREAM.INFO."+stream, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("info %s: %v", stream, err)
	}
	var si struct {
		Created time.Time `json:"created"`
	}
	if err := json.Unmarshal(msg.Data, &si); err != nil || si.Created.IsZero() {
		t.Fatalf("info %s: %s (%v)", stream, msg.Data, err)
	}
	return si.Created
}
