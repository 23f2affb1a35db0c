package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// This file serves the health checks of the MCP listener, for load
// balancers and orchestrators; neither needs a token:
//
//   - GET /healthz: the process is alive and serving HTTP (200 "ok").
//   - GET /readyz: the gateway can serve calls: its NATS connection is up,
//     JetStream answers a cheap request (account info) within
//     readyzTimeout, and the host registry is loaded from the hosts bucket.
//     200 "ready", or 503 with one line per problem. Damage found in the
//     audit stream (gateway/audit) adds lines after "ready", the gateway
//     still serving.
//
// A readiness answer is reused for readyzCache, so that probes cannot turn
// into a flood of JetStream requests.

const (
	readyzTimeout = 2 * time.Second
	readyzCache   = time.Second
)

// readiness caches the last readiness check.
type readiness struct {
	mu       sync.Mutex
	at       time.Time
	problems []string
}

func (g *Gateway) healthHandlers(mux *http.ServeMux) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		problems := g.ready(r.Context())
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if len(problems) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready:\n%s\n", strings.Join(problems, "\n"))
			return
		}
		fmt.Fprintln(w, "ready")
		// Damage to the audit trail does not stop calls (the stream is
		// made whole again and the gap recorded), but whoever watches
		// the gateway must see it.
		if damages, n := g.subsys.audit.Damages(); n > 0 {
			fmt.Fprintf(w, "warning: audit trail damaged %d time(s) since this gateway started; the last:\n", n)
			for _, d := range damages {
				fmt.Fprintf(w, "audit: %s %s\n", d.At.UTC().Format(time.RFC3339), d.What)
			}
		}
	})
}

// ready returns what keeps the gateway from serving calls (none: ready).
// Checks run one at a time; an answer younger than readyzCache is reused.
func (g *Gateway) ready(ctx context.Context) []string {
	g.serving.readiness.mu.Lock()
	defer g.serving.readiness.mu.Unlock()
	now := time.Now()
	if !g.serving.readiness.at.IsZero() && now.Sub(g.serving.readiness.at) < readyzCache {
		return g.serving.readiness.problems
	}
	var problems []string
	if !g.conns.nc.IsConnected() {
		problems = append(problems, "NATS: not connected ("+strings.ToLower(g.conns.nc.Status().String())+")")
	} else if err := g.jetStreamAnswers(ctx); err != nil {
		problems = append(problems, "JetStream: "+err.Error())
	}
	if !g.calling.store.isLoaded() {
		problems = append(problems, "host registry: the hosts bucket is not loaded yet")
	}
	g.serving.readiness.at, g.serving.readiness.problems = time.Now(), problems
	return problems
}

// jetStreamAnswers asks JetStream for the account's info.
func (g *Gateway) jetStreamAnswers(ctx context.Context) error {
	js, err := jetstream.New(g.conns.nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readyzTimeout)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("no answer to an account info request within %s: %w", readyzTimeout, err)
	}
	return nil
}
