package gateway

import (
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/internal/loglimit"
)

// This file logs the connections the NATS servers refuse for want of a
// valid credential (an agent revoked, expired, or a stranger): one line
// each, from the servers' auth-error advisories, which the gateway's
// system user hears on every server of a cluster. A flood from one
// address costs a few lines a minute (logLimiter).

// authErrorSubject is where NATS servers publish the connections they
// refused at authentication.
const authErrorSubject = "$SYS.SERVER.*.CLIENT.AUTH.ERR"

// authErrorEvent is the part of a server's advisory the gateway logs.
type authErrorEvent struct {
	Client struct {
		Host string `json:"host"`
		User string `json:"user"`
		Name string `json:"name"`
		JWT  string `json:"jwt"`
	} `json:"client"`
	Reason string `json:"reason"`
}

// watchAuthErrors logs refused connections until the system user's
// connection closes.
func (g *Gateway) watchAuthErrors() error {
	lim := loglimit.New(logEvery, 3)
	_, err := g.conns.sys.Subscribe(authErrorSubject, func(m *nats.Msg) {
		var ev authErrorEvent
		if json.Unmarshal(m.Data, &ev) != nil {
			return
		}
		attrs := []any{"remote", ev.Client.Host, "reason", ev.Reason}
		key := ev.Client.User
		if uc, err := jwt.DecodeUserClaims(ev.Client.JWT); key == "" && err == nil {
			// The key the refused credential names (its own claim).
			key = uc.Subject
		}
		if key != "" {
			attrs = append(attrs, "key", protocol.Clip(key, 100))
			if host, ok := g.subsys.agentIndex.KeyHost(key); ok {
				attrs = append(attrs, "host", host)
			}
		}
		if ev.Client.Name != "" {
			attrs = append(attrs, "client", protocol.Clip(ev.Client.Name, 100))
		}
		lim.Log(g.log, slog.LevelWarn, ev.Client.Host, "NATS connection refused: no valid credential", attrs...)
	})
	if err != nil {
		return fmt.Errorf("subscribe to the NATS servers' auth errors: %w", err)
	}
	return nil
}
