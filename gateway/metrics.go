package gateway

import (
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fleetmcp/fleetmcp/protocol"

	"github.com/fleetmcp/fleetmcp/gateway/audit"
	"github.com/fleetmcp/fleetmcp/gateway/internal/netutil"
)

// This file exports the gateway's Prometheus metrics, on a registry of
// its own (never the global one): tool calls, fan-outs, refusals and
// audit failures are counted as they happen; the fleet (hosts by state,
// agent versions, host policies, each agent's own counters from its
// announces) and the NATS connection are read from the registry at each
// scrape, so they cost nothing between scrapes. Every label has bounded
// values: tool names the gateway serves, outcomes, and hosts, versions
// and digests, which the host registry bounds.

// metrics are the gateway's collectors.
type metrics struct {
	reg *prometheus.Registry

	calls       *prometheus.CounterVec   // tool, outcome
	callSeconds *prometheus.HistogramVec // tool
	fanoutHosts *prometheus.HistogramVec // tool
	fanoutSecs  *prometheus.HistogramVec // tool
	rateLimited prometheus.Counter
}

func newMetrics(g *Gateway) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.calls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleet_tool_calls_total", Help: "Tool calls finished, by tool and outcome (ok, error, refused, timed_out, cancelled).",
	}, []string{"tool", "outcome"})
	m.callSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "fleet_tool_call_duration_seconds", Help: "Duration of tool calls, by tool.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
	}, []string{"tool"})
	m.fanoutHosts = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "fleet_fanout_hosts", Help: "Hosts a fan-out call selected, by tool.",
		Buckets: prometheus.ExponentialBuckets(1, 4, 8), // 1 to 16384
	}, []string{"tool"})
	m.fanoutSecs = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "fleet_fanout_duration_seconds", Help: "Duration of fan-out calls, by tool.",
		Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
	}, []string{"tool"})
	m.rateLimited = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fleet_rate_limited_total", Help: "Tool calls refused by a caller's rate limit.",
	})
	m.reg.MustRegister(m.calls, m.callSeconds, m.fanoutHosts, m.fanoutSecs, m.rateLimited,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "fleet_audit_write_failures_total", Help: "Audit records the stream or the audit file did not take (each is logged in full instead).",
		}, func() float64 { return float64(g.subsys.audit.Failures()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "fleet_identity_conflicts_total", Help: "Times two live NATS connections were found on one host's identity (the host is refused until an operator revokes or re-enrols it).",
		}, func() float64 { return float64(g.calling.identityConflictCount.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleet_hosts_identity_conflict", Help: "Hosts refused now for two live NATS connections on their identity.",
		}, func() float64 { return float64(g.calling.reg.identityConflicts()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "fleet_audit_damage_total", Help: "Damage found in the audit stream (deleted, cut, records deleted, configuration changed, a foreign message under a record's message ID); each is logged, and a loss recorded as a gap.",
		}, func() float64 { _, n := g.subsys.audit.Damages(); return float64(n) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleet_nats_connected", Help: "1 while the gateway's NATS connection is up.",
		}, func() float64 { return boolFloat(g.conns.nc.IsConnected()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleet_transfer_bytes_in_use", Help: "Bytes of the large-transfer budget (--max_transfer_mib) requests and results in flight hold.",
		}, func() float64 { return float64(g.calling.transfers.inUse.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "fleet_transfer_bytes_limit", Help: "The large-transfer budget (--max_transfer_mib) in bytes.",
		}, func() float64 { return float64(g.cfg.MaxTransferBytes) }),
		&fleetCollector{reg: g.calling.reg},
	)
	m.reg.MustRegister(boundCollectors(&g.calling.bounds.counts)...)
	return m
}

// boundCollectors export what the per-host bounds dropped
// (hostbounds.go).
func boundCollectors(c *boundCounts) []prometheus.Collector {
	var out []prometheus.Collector
	for _, r := range []struct {
		reason string
		n      *atomic.Int64
	}{
		{"rate_limited", &c.reportsRateLimited}, {"unsigned", &c.reportsUnsigned}, {"malformed", &c.reportsMalformed},
		{"not_sent", &c.reportsNotSent}, {"call_recorded", &c.reportsCallCapped}, {"queue_full", &c.reportsQueueFull},
	} {
		out = append(out, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "fleet_refusal_reports_dropped_total", ConstLabels: prometheus.Labels{"reason": r.reason},
			Help: "Hosts' refusal reports not recorded as a refusal of a call, by reason: rate_limited (beyond the host's 10 a second), unsigned, malformed, " +
				"not_sent (about no call this gateway sent the host: summarised instead), call_recorded (the call's refusals recorded enough times), queue_full.",
		}, func() float64 { return float64(r.n.Load()) }))
	}
	for _, r := range []struct {
		reason string
		n      *atomic.Int64
	}{{"too_early", &c.renewalsEarly}, {"rate_limited", &c.renewalsRateLimited}} {
		out = append(out, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "fleet_renewals_refused_total", ConstLabels: prometheus.Labels{"reason": r.reason},
			Help: "Renewal requests answered without a renewal or an audit record, by reason: too_early (before half the credential's life), rate_limited (beyond the host's bound).",
		}, func() float64 { return float64(r.n.Load()) }))
	}
	return out
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// metricTool returns the tool label of a call: the tool's name when the
// gateway serves it, else "other" (a client may send any name).
func metricTool(tool string) string {
	if perHostTool(tool) || protocol.FanoutBase(tool) != "" || tool == protocol.ToolHosts || protocol.IsAdminTool(tool) {
		return tool
	}
	return "other"
}

// observeCall records a finished call.
func (m *metrics) observeCall(rec *audit.Record, took time.Duration, fanout map[string]int) {
	tool := metricTool(rec.Tool)
	outcome := rec.Outcome
	switch outcome {
	case audit.OutcomeOK, audit.OutcomeError, audit.OutcomeRefused, audit.OutcomeTimedOut, audit.OutcomeCancelled:
	default:
		outcome = "unknown"
	}
	m.calls.WithLabelValues(tool, outcome).Inc()
	m.callSeconds.WithLabelValues(tool).Observe(took.Seconds())
	if fanout != nil {
		n := 0
		for _, c := range fanout {
			n += c
		}
		m.fanoutHosts.WithLabelValues(tool).Observe(float64(n))
		m.fanoutSecs.WithLabelValues(tool).Observe(took.Seconds())
	}
}

// serveMetrics serves the metrics on Config.MetricsListen, if set.
func (g *Gateway) serveMetrics() error {
	if g.cfg.MetricsListen == "" {
		return nil
	}
	ln, err := netutil.Listen(g.cfg.MetricsListen, "the metrics endpoint", "another exporter", "--metrics_listen")
	if err != nil {
		return err
	}
	if !isLoopback(g.cfg.MetricsListen) {
		g.log.Warn("metrics are served without authentication beyond loopback: let only your Prometheus reach this address", "metrics", ln.Addr().String())
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", g.serving.metrics.handler())
	g.serving.metricsSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	srv := g.serving.metricsSrv
	g.life.loops.Go(func() { _ = srv.Serve(ln) }) // Shutdown closes srv, then joins
	g.serving.metricsLn = ln
	return nil
}

// MetricsURL returns the URL of the metrics on Config.MetricsListen
// (empty: not served there).
func (g *Gateway) MetricsURL() string {
	if g.serving.metricsLn == nil {
		return ""
	}
	return "http://" + g.serving.metricsLn.Addr().String() + "/metrics"
}

// handler serves the metrics in the Prometheus text format.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, MaxRequestsInFlight: 4, Timeout: 10 * time.Second})
}

// fleetCollector reads the host registry at each scrape.
type fleetCollector struct{ reg *registry }

var (
	metricHosts    = prometheus.NewDesc("fleet_hosts", "Hosts the gateway knows, by state (online, offline, revoked; a revoked host counts only as revoked).", []string{"state"}, nil)
	metricVersions = prometheus.NewDesc("fleet_agent_versions", "Online hosts by agent version.", []string{"version"}, nil)
	metricPolicies = prometheus.NewDesc("fleet_host_policies", "Online hosts by the digest of the host policy they enforce (\"unrestricted\": none).", []string{"digest"}, nil)
	metricServed   = prometheus.NewDesc("fleet_agent_calls_served_total", "Calls the host's agent ran to a result since it started (from its announce).", []string{"host"}, nil)
	metricFailed   = prometheus.NewDesc("fleet_agent_calls_failed_total", "Calls the host's agent ran that ended in a tool error.", []string{"host"}, nil)
	metricRefused  = prometheus.NewDesc("fleet_agent_calls_refused_total", "Calls the host's agent answered without running them (host policy, busy, unknown tool).", []string{"host"}, nil)
	metricQueued   = prometheus.NewDesc("fleet_agent_queue_depth", "Calls waiting for a worker on the host.", []string{"host"}, nil)
	metricBusy     = prometheus.NewDesc("fleet_agent_calls_running", "Calls running on the host.", []string{"host"}, nil)
	metricTasks    = prometheus.NewDesc("fleet_agent_tasks_running", "Background tasks running on the host.", []string{"host"}, nil)
	metricRSS      = prometheus.NewDesc("fleet_agent_resident_memory_bytes", "Resident memory of the host's agent process (Linux and Windows: now; macOS: its peak).", []string{"host"}, nil)
)

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{metricHosts, metricVersions, metricPolicies, metricServed, metricFailed, metricRefused, metricQueued, metricBusy, metricTasks, metricRSS} {
		ch <- d
	}
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	hosts := c.reg.metricsView()
	var online, offline, revoked int
	versions, policies := map[string]int{}, map[string]int{}
	for _, h := range hosts {
		switch {
		case h.revoked:
			revoked++
			continue
		case !h.online:
			offline++
			continue
		}
		online++
		versions[h.version]++
		policies[strings.TrimSpace(h.digest)]++
		gauge := func(d *prometheus.Desc, t prometheus.ValueType, v float64) { emit(ch, d, t, v, h.host) }
		gauge(metricBusy, prometheus.GaugeValue, float64(h.busy))
		if s := h.stats; s != nil {
			gauge(metricServed, prometheus.CounterValue, float64(s.CallsServed))
			gauge(metricFailed, prometheus.CounterValue, float64(s.CallsFailed))
			gauge(metricRefused, prometheus.CounterValue, float64(s.CallsRefused))
			gauge(metricQueued, prometheus.GaugeValue, float64(s.Queued))
			gauge(metricTasks, prometheus.GaugeValue, float64(s.Tasks))
			if s.RSSBytes > 0 {
				gauge(metricRSS, prometheus.GaugeValue, float64(s.RSSBytes))
			}
		}
	}
	for state, n := range map[string]int{"online": online, "offline": offline, "revoked": revoked} {
		emit(ch, metricHosts, prometheus.GaugeValue, float64(n), state)
	}
	for v, n := range versions {
		emit(ch, metricVersions, prometheus.GaugeValue, float64(n), v)
	}
	for d, n := range policies {
		if d == "" {
			d = "unrestricted"
		}
		emit(ch, metricPolicies, prometheus.GaugeValue, float64(n), d)
	}
}

// emit sends one sample. Label values come from announces, which JSON
// decoding keeps valid UTF-8; one the client library refuses anyway is
// left out rather than failing the scrape.
func emit(ch chan<- prometheus.Metric, d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
	if m, err := prometheus.NewConstMetric(d, t, v, labels...); err == nil {
		ch <- m
	}
}

// hostMetrics is what the metrics show of one host.
type hostMetrics struct {
	host, version, digest string
	online, revoked       bool
	busy                  int
	stats                 *protocol.AgentStats
}

// metricsView returns what the metrics show of every host.
func (r *registry) metricsView() []hostMetrics {
	now := r.now()
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]hostMetrics, 0, len(r.hosts))
	for name, e := range r.hosts {
		if e.facts == nil {
			continue
		}
		_, revoked := r.labels(name)
		h := hostMetrics{host: name, version: e.facts.AgentVersion, digest: e.facts.PolicyDigest, revoked: revoked,
			online: r.liveCount(e, now) > 0, busy: e.busy}
		if h.online {
			h.stats = e.stats
		}
		out = append(out, h)
	}
	return out
}
