package gateway

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/enrol"
	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/gateway/signing"
)

// This file brings up the gateway's NATS side: the embedded server or
// the connections to an external cluster, the system user, the agent
// records and revocations, and takes it down again (stopNATS).

func (g *Gateway) startNATS(ctx context.Context) error {
	var err error
	if len(g.cfg.NATSURLs) > 0 {
		err = g.connectExternal(ctx)
	} else {
		err = g.startEmbedded()
	}
	if err != nil {
		return err
	}
	g.calling.reg = newRegistry(g.log, g.cfg.OfflineAfter, g.subsys.agentIndex)
	g.calling.reg.maxBytes = g.cfg.Hosts.MaxBytes
	g.subsys.keys = signing.NewKeyServer(g.subsys.signer, g.conns.nc, g.onlineHosts, g.now, g.log)
	g.calling.reg.heardKeys = g.subsys.keys.Behind
	if _, err := g.conns.nc.Subscribe(protocol.PresenceWildcard(), g.calling.reg.onPresence); err != nil {
		return fmt.Errorf("subscribe presence: %w", err)
	}
	if g.calling.router, err = newRouter(g.conns.nc, g.calling.reg, g.log, g.cfg.Silence, g.calling.transfers, g.calling.tracing, g.subsys.signer, g.enrolledKey, g.calling.bounds, g.conns.hostNC); err != nil {
		return err
	}
	if err := g.conns.nc.Flush(); err != nil {
		return fmt.Errorf("NATS: %w", err)
	}
	if err := g.conns.hostNC.Flush(); err != nil {
		return fmt.Errorf("NATS: %w", err)
	}
	// Ask every agent to announce itself now rather than at its next
	// heartbeat.
	return g.conns.nc.Publish(protocol.DiscoverSubject(), nil)
}

// resolveReplicas settles the replica counts left at their default: 3
// when the gateway's NATS server is a cluster node, else 1.
func (g *Gateway) resolveReplicas() {
	clustered := g.cfg.clustered() || g.conns.nc.ConnectedClusterName() != ""
	g.cfg.Hosts.Replicas = replicasDefault(g.cfg.Hosts.Replicas, clustered)
	g.cfg.Audit.Replicas = replicasDefault(g.cfg.Audit.Replicas, clustered)
	if clustered {
		g.log.Info("NATS cluster: streams and buckets replicated", "cluster", g.conns.nc.ConnectedClusterName(),
			"audit_replicas", g.cfg.Audit.Replicas, "hosts_replicas", g.cfg.Hosts.Replicas)
	}
}

// natsOptions are the options of the gateway's own connection.
func (g *Gateway) natsOptions() []nats.Option {
	return append(reconnectOptions(),
		nats.Name("fleet-gateway"),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			g.log.Info("NATS reconnected", "url", nc.ConnectedUrlRedacted())
			_ = nc.Publish(protocol.DiscoverSubject(), nil)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				g.log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			g.log.Warn("NATS error", "err", err)
		}),
	)
}

// reconnectOptions keep a gateway connection alive for good, noticing a
// dead server within about 30 s.
func reconnectOptions() []nats.Option {
	return []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(250*time.Millisecond, time.Second),
		nats.PingInterval(10 * time.Second),
		nats.MaxPingsOutstanding(2),
	}
}

// sysOptions are the options of the system user's connection.
func (g *Gateway) sysOptions() []nats.Option {
	return append(reconnectOptions(),
		nats.Name("fleet-gateway system"),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			g.log.Warn("NATS error (system user)", "err", err)
		}),
	)
}

// startEmbedded starts the embedded server in operator mode, with TLS
// beyond loopback, and connects the gateway and its system user in
// process.
func (g *Gateway) startEmbedded() error {
	// Nothing in the data directory is touched before it is ours.
	var err error
	if g.conns.dataLock, err = lockDataDir(g.cfg.DataDir); err != nil {
		return err
	}
	if err := checkDataFormat(g.cfg.DataDir); err != nil {
		return err
	}
	ecfg := natsauth.EmbeddedConfig{DataDir: g.cfg.DataDir, Listen: g.cfg.NATSListen, MaxPayload: g.cfg.NATSMaxPayload,
		MaxCall: g.cfg.MaxCallDuration, Log: g.log}
	if g.cfg.clustered() {
		// A cluster node refuses agents until its gateway has pushed the
		// revocations the agent records call for (cluster.go).
		ecfg.Cluster = &natsauth.ClusterOptions{Name: g.cfg.Cluster.Name, ServerName: g.cfg.Name,
			Listen: g.cfg.Cluster.Listen, Routes: g.cfg.Cluster.Routes}
	}
	emb, err := natsauth.OpenEmbedded(ecfg)
	if err != nil {
		return err
	}
	tlsConf, err := g.embeddedTLS()
	if err != nil {
		return err
	}
	if g.cfg.clustered() && g.cfg.Cluster.RouteCert == "" && g.conns.natsCA == nil {
		// Routes between the nodes use certificates from the fleet CA.
		if g.conns.natsCA, err = natsauth.LoadOrCreateCA(g.cfg.DataDir); err != nil {
			return err
		}
	}
	var routes *tls.Config
	if g.cfg.clustered() {
		if routes, err = natsauth.RouteTLS(g.cfg.Cluster.RouteCert, g.cfg.Cluster.RouteKey, g.cfg.Cluster.RouteCA, g.conns.natsCA, routeNames(&g.cfg)); err != nil {
			return err
		}
	}
	if err := emb.Start(tlsConf, routes); err != nil {
		return err
	}
	g.conns.embedded = emb
	// Its own users are never revoked through the ledger: whoever holds
	// the seal's key could otherwise cut the gateway off its server.
	gwUser, err := emb.GatewayUser()
	if err != nil {
		return err
	}
	if g.conns.nc, err = nats.Connect("", append(g.natsOptions(), emb.InProcess(), gwUser)...); err != nil {
		return fmt.Errorf("connect to the embedded NATS server: %w", err)
	}
	if g.conns.hostNC, err = nats.Connect("", append(g.hostConnOptions(), emb.InProcess(), gwUser)...); err != nil {
		return fmt.Errorf("connect to the embedded NATS server: %w", err)
	}
	sysUser, err := emb.SystemUser()
	if err != nil {
		return err
	}
	if g.conns.sys, err = nats.Connect("", append(g.sysOptions(), emb.InProcess(), sysUser)...); err != nil {
		return fmt.Errorf("connect to the embedded NATS server as its system user: %w", err)
	}
	g.subsys.authority, err = emb.Authority(g.conns.sys, g.cfg.AgentCredentialTTL, g.now, g.log)
	return err
}

// natsTLS reports whether the embedded server serves TLS: beyond
// loopback always, on loopback when asked to or given a certificate.
func (g *Gateway) natsTLS() bool {
	return g.cfg.NATSListen != "" && (g.cfg.NATSTLS || g.cfg.NATSTLSCert != "" || !isLoopback(g.cfg.NATSListen))
}

// embeddedTLS returns the embedded server's TLS configuration (nil: no
// TLS), and sets the CA agents get and its pin: the operator's chain
// (NATSTLSCert) and its last certificate, or a certificate from the fleet
// CA and the fleet CA.
func (g *Gateway) embeddedTLS() (*tls.Config, error) {
	if !g.natsTLS() {
		return nil, nil
	}
	if g.cfg.NATSTLSCert != "" {
		conf, chain, err := loadServerChain(g.cfg.NATSTLSCert, g.cfg.NATSTLSKey, "--nats_tls_cert", "--nats_tls_key")
		if err != nil {
			return nil, fmt.Errorf("embedded NATS TLS: %w", err)
		}
		ca := chain[len(chain)-1]
		if len(chain) < 2 || !ca.IsCA {
			return nil, fmt.Errorf("embedded NATS TLS: --nats_tls_cert %s ends with the certificate of %q, which is not a CA certificate after the server's: append the certificate of the CA that issued it (agents get that CA at enrolment and trust it alone for NATS)",
				g.cfg.NATSTLSCert, ca.Subject.String())
		}
		g.conns.natsCAPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
		g.conns.natsPin = protocol.CAPin(ca)
		return conf, nil
	}
	var err error
	if g.conns.natsCA, err = natsauth.LoadOrCreateCA(g.cfg.DataDir); err != nil {
		return nil, err
	}
	host, _, _ := net.SplitHostPort(g.cfg.NATSListen)
	conf, err := g.conns.natsCA.ServerTLS(natsauth.LeafNames(host, g.advertisedNames()))
	if err != nil {
		return nil, fmt.Errorf("embedded NATS TLS: %w", err)
	}
	g.conns.natsCAPEM, g.conns.natsPin = g.conns.natsCA.PEM(), g.conns.natsCA.Pin()
	return conf, nil
}

// connectExternal connects to an external cluster with the files of its
// setup, and checks them.
func (g *Gateway) connectExternal(ctx context.Context) error {
	x, err := natsauth.LoadExternal(natsauth.ExternalConfig{CredsFile: g.cfg.NATSCredsFile, AgentSigningKeyFile: g.cfg.NATSAgentSigningKeyFile,
		OperatorSigningKeyFile: g.cfg.NATSOperatorSigningKeyFile, CAFile: g.cfg.NATSCAFile})
	if err != nil {
		return err
	}
	g.conns.external = x
	url := strings.Join(g.cfg.NATSURLs, ",")
	if g.conns.nc, err = nats.Connect(url, append(g.natsOptions(), x.Options(g.cfg.NATSCredsFile)...)...); err != nil {
		return fmt.Errorf("connect to NATS %s with --nats_creds %s: %w", url, g.cfg.NATSCredsFile, err)
	}
	if g.conns.hostNC, err = nats.Connect(url, append(g.hostConnOptions(), x.Options(g.cfg.NATSCredsFile)...)...); err != nil {
		return fmt.Errorf("connect to NATS %s with --nats_creds %s: %w", url, g.cfg.NATSCredsFile, err)
	}
	if g.conns.sys, err = nats.Connect(url, append(g.sysOptions(), x.Options(g.cfg.NATSSystemCredsFile)...)...); err != nil {
		return fmt.Errorf("connect to NATS %s with --nats_system_creds %s: %w", url, g.cfg.NATSSystemCredsFile, err)
	}
	if err := x.Check(ctx, g.conns.sys); err != nil {
		return fmt.Errorf("external NATS cluster: %w", err)
	}
	g.conns.natsCAPEM = x.CAPEM()
	g.subsys.authority = x.Authority(g.conns.nc, g.conns.sys, g.cfg.AgentCredentialTTL, g.now, g.log)
	return nil
}

// recordSeal returns the seal of the agent records and join tokens
// (recordseal.go), made from the agent signing key on first use (during
// Start).
func (g *Gateway) recordSeal() (*recordSeal, error) {
	if g.subsys.seal == nil {
		s, err := newRecordSeal(g.subsys.authority.AgentSigner())
		if err != nil {
			return nil, err
		}
		g.subsys.seal = s
	}
	return g.subsys.seal, nil
}

// openAgents opens the agent records, brings the servers' revocations in
// step with them (a gateway may have stopped between a revocation and
// its push) and starts the revocation loop.
func (g *Gateway) openAgents(ctx context.Context) error {
	g.subsys.agentIndex.OnRevoked(func(string) { g.reconcileSoon() })
	seal, err := g.recordSeal()
	if err != nil {
		return err
	}
	if g.subsys.agents, err = enrol.OpenAgents(g.conns.nc, g.subsys.agentIndex, seal.s, g.cfg.Hosts.Replicas, g.streamAdmin("KV_"+protocol.AgentsBucket), g.log.With("component", "agents")); err != nil {
		return err
	}
	// The embedded server holds every key revoked while a credential
	// issued before could still be valid: it may have missed a
	// revocation by key while down, which no record names.
	recent := g.now().Add(-max(g.cfg.AgentCredentialTTL, enrol.MaxTokenTTL) - natsauth.PruneSlack)
	if err := g.subsys.authority.OpenLedger(ctx, g.conns.nc, max(g.cfg.Hosts.Replicas, 1), recent, g.log.With("component", "revoked-keys")); err != nil {
		return err
	}
	g.subsys.authority.SetRecords(agentRevocations{g.subsys.agents})
	rctx, cancel := context.WithTimeout(ctx, natsauth.ReconcileTimeout)
	err = g.subsys.authority.Reconcile(rctx)
	cancel()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("reconcile revocations: %w", context.Cause(ctx))
	}
	if err != nil {
		g.log.Warn("revocations not in step with the NATS servers yet; retrying in the background", "err", err)
	}
	lctx, stop := context.WithCancel(context.Background())
	g.life.stopLoops = stop
	g.life.loops.Go(func() { g.subsys.authority.RevocationLoop(lctx, g.log) })
	return g.watchConnections(lctx)
}

func (g *Gateway) stopNATS() {
	if g.life.stopLoops != nil {
		g.life.stopLoops()
		g.life.loops.Wait()
	}
	g.subsys.enrol.Close()
	g.subsys.keys.Close()
	g.calling.agentSvc.close()
	if g.subsys.skillStore != nil {
		g.subsys.skillStore.Close()
	}
	if g.subsys.agents != nil {
		g.subsys.agents.Close()
	}
	if g.subsys.authority != nil {
		g.subsys.authority.Close()
	}
	if g.calling.store != nil {
		g.calling.store.close()
	}
	if g.calling.router != nil {
		g.calling.router.close()
	}
	if g.conns.nc != nil {
		g.conns.nc.Close()
	}
	if g.conns.hostNC != nil {
		g.conns.hostNC.Close()
	}
	if g.conns.sys != nil {
		g.conns.sys.Close()
	}
	if g.conns.embedded != nil {
		g.conns.embedded.Shutdown()
	}
	if g.conns.dataLock != nil {
		g.conns.dataLock.Close()
	}
}
