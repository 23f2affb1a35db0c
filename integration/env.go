package integration

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/identity"
	"github.com/fleetmcp/fleetmcp/gateway"
	"github.com/fleetmcp/fleetmcp/gateway/natsauth"
	"github.com/fleetmcp/fleetmcp/integration/simfleet"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Options shape an Env. Zero values give a small, fast fleet.
type Options struct {
	// Agents are started in-process at NewEnv (default: "alpha").
	Agents []string
	// MaxPayload sets the NATS server's max_payload (default 1 MiB).
	MaxPayload int32
	// Gateway adjusts the gateway config before start.
	Gateway func(*gateway.Config)
	// Agent adjusts every in-process agent's config before start.
	Agent func(*agent.Config)
	// Labels are the labels each agent is enrolled with (default:
	// env=test). Env.Label changes one host's.
	Labels func(host string) map[string]string
	// Quiet drops component logs (benchmarks).
	Quiet bool
	// ExternalNATS runs the NATS server outside the gateway, as a cluster
	// would be, so that tests can stop and restart it: in operator mode,
	// configured from the files fleet-gateway nats-setup writes. By
	// default the gateway embeds it, as it does out of the box.
	ExternalNATS bool
	// ServerURL and ServerSetup connect the gateway to a NATS server the
	// test started itself, in operator mode from the files nats-setup
	// wrote into ServerSetup.
	ServerURL, ServerSetup string
	// Revoker (with ExternalNATS) runs the cluster's revoker beside the
	// server, holding the operator signing key, and the gateway without
	// it.
	Revoker bool
}

// Env is a running fleet for one test.
type Env struct {
	t        testing.TB
	opts     Options
	log      *slog.Logger
	natsPort int
	// setup is the external server's operator-mode setup (nats-setup's
	// directory); natsDir its JetStream and resolver state.
	setup   string
	natsDir string

	gwConfig gateway.Config // as first started, for RestartGateway and StartGateway

	mu     sync.Mutex
	nats   *server.Server
	agents map[string]*agentRun
	// keys are the agents' nkeys by host, made at their first enrolment;
	// labels the labels Label gave hosts.
	keys     map[string]nkeys.KeyPair
	labels   map[string]map[string]string
	procs    map[string]procSpec // how each agent process was started
	Gateway  *gateway.Gateway
	replicas []*gateway.Gateway // started by StartGateway
}

// procSpec is how an agent process was started, so that it can be started
// again on the same directories.
type procSpec struct {
	dir   string
	extra []string
}

type agentRun struct {
	cancel context.CancelFunc
	done   chan struct{}
	cmd    *exec.Cmd // set for agents run as processes
	dir    string
}

// NewEnv starts NATS, the gateway and the requested agents, and waits until
// every agent is online. Everything is stopped by t.Cleanup. At most one
// Options may be given.
func NewEnv(t testing.TB, options ...Options) *Env {
	t.Helper()
	var opts Options
	switch len(options) {
	case 0:
	case 1:
		opts = options[0]
	default:
		t.Fatal("NewEnv takes at most one Options")
	}
	if opts.Agents == nil {
		opts.Agents = []string{"alpha"}
	}
	e := &Env{t: t, opts: opts, agents: make(map[string]*agentRun), procs: make(map[string]procSpec),
		keys: make(map[string]nkeys.KeyPair), labels: make(map[string]map[string]string)}
	e.log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if opts.Quiet {
		e.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	cfg := gateway.Config{
		Listen:       "127.0.0.1:0",
		AuthDisabled: true,
		Silence:      2 * time.Second,
		OfflineAfter: 3 * time.Second,
		Logger:       e.log.With("component", "gateway"),
	}
	switch {
	case opts.ServerURL != "":
		e.setup = opts.ServerSetup
		cfg.NATSURLs = []string{opts.ServerURL}
		e.externalFiles(&cfg)
	case opts.ExternalNATS:
		e.natsPort = FreePort(t)
		e.natsDir = t.TempDir()
		e.setup = filepath.Join(t.TempDir(), "nats-setup")
		if _, err := gateway.NATSSetup(e.setup, 0); err != nil {
			t.Fatal(err)
		}
		e.startNATS()
		cfg.NATSURLs = []string{e.NATSURL()}
		e.externalFiles(&cfg)
	default:
		cfg.DataDir = t.TempDir()
		cfg.NATSListen = "127.0.0.1:0"
		cfg.NATSMaxPayload = opts.MaxPayload
	}
	if opts.Gateway != nil {
		opts.Gateway(&cfg)
	}
	if opts.Revoker {
		cfg.NATSOperatorSigningKeyFile = ""
	}
	e.gwConfig = cfg
	gw, err := gateway.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	e.Gateway = gw
	t.Cleanup(e.close)
	if opts.Revoker {
		e.startRevoker()
	}
	for _, name := range opts.Agents {
		e.StartAgent(name, nil)
	}
	for _, name := range opts.Agents {
		e.WaitHost(name, true)
	}
	return e
}

// externalFiles points cfg at the files of the external server's setup.
func (e *Env) externalFiles(cfg *gateway.Config) {
	f := gateway.NATSSetupFiles
	cfg.NATSCredsFile = filepath.Join(e.setup, f.GatewayCreds)
	cfg.NATSSystemCredsFile = filepath.Join(e.setup, f.SystemCreds)
	cfg.NATSAgentSigningKeyFile = filepath.Join(e.setup, f.AgentSigningKey)
	cfg.NATSOperatorSigningKeyFile = filepath.Join(e.setup, f.OperatorSigningKey)
	cfg.SigningKeyFile = filepath.Join(e.setup, f.SigningKey)
}

// natsOptions builds a fresh server config each time (options must not be
// reused after NewServer): the operator-mode include nats-setup wrote,
// with this server's address, JetStream and resolver directories.
func (e *Env) natsOptions() *server.Options {
	// An include is relative to the file that includes it.
	name := gateway.NATSSetupFiles.ServerConfig
	include, err := os.ReadFile(filepath.Join(e.setup, name))
	if err == nil {
		err = os.WriteFile(filepath.Join(e.natsDir, name), include, 0o600)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	conf := filepath.Join(e.natsDir, "server.conf")
	text := fmt.Sprintf("include %q\nlisten: \"127.0.0.1:%d\"\njetstream { store_dir: %q }\n"+
		"resolver { type: full, dir: %q, allow_delete: false, interval: \"2m\", timeout: \"5s\" }\n",
		name, e.natsPort, filepath.Join(e.natsDir, "jetstream"), filepath.Join(e.natsDir, "jwt"))
	if e.opts.MaxPayload > 0 {
		text += fmt.Sprintf("max_payload: %d\n", e.opts.MaxPayload)
	}
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		e.t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		e.t.Fatalf("nats server config: %v", err)
	}
	opts.NoSigs, opts.NoLog = true, true
	return opts
}

// GatewayConn connects to the external NATS server as the gateway's
// user (unrestricted in the fleet account).
func (e *Env) GatewayConn() *nats.Conn {
	e.t.Helper()
	if e.setup == "" {
		e.t.Fatal("GatewayConn needs an external NATS server")
	}
	nc, err := nats.Connect(e.NATSURL(), nats.UserCredentials(filepath.Join(e.setup, gateway.NATSSetupFiles.GatewayCreds)))
	if err != nil {
		e.t.Fatalf("connect as the gateway: %v", err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

func (e *Env) startNATS() {
	ns, err := server.NewServer(e.natsOptions())
	if err != nil {
		e.t.Fatalf("nats server: %v", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		e.t.Fatalf("nats server not ready")
	}
	e.mu.Lock()
	e.nats = ns
	e.mu.Unlock()
}

// StopNATS shuts the external NATS server down; RestartNATS brings it back
// on the same port.
func (e *Env) StopNATS() {
	if !e.opts.ExternalNATS {
		e.t.Fatal("StopNATS needs Options.ExternalNATS")
	}
	e.mu.Lock()
	ns := e.nats
	e.nats = nil
	e.mu.Unlock()
	if ns != nil {
		ns.Shutdown()
		ns.WaitForShutdown()
	}
}

// RestartNATS stops and starts the NATS server on the same port.
func (e *Env) RestartNATS() {
	e.StopNATS()
	e.startNATS()
}

// NATSURL is the URL agents dial.
func (e *Env) NATSURL() string {
	if e.opts.ServerURL != "" {
		return e.opts.ServerURL
	}
	if !e.opts.ExternalNATS {
		return e.Gateway.NATSURL()
	}
	return fmt.Sprintf("nats://127.0.0.1:%d", e.natsPort)
}

// AgentConfig returns the config an in-process agent called name gets,
// enrolling it with the gateway.
func (e *Env) AgentConfig(name string) agent.Config {
	dir := e.t.TempDir()
	creds, seed := e.Enrol(name)
	cfg := agent.Config{
		Servers:     []string{e.NATSURL()},
		Name:        name,
		Credentials: agent.Credentials{JWT: func() (string, error) { return creds.JWT, nil }, Seed: seed, CA: creds.CAPEM},
		GatewayKeys: creds.SigningKeys, GatewayKeySerial: creds.SigningKeySerial,
		Cwd:          dir,
		StateDir:     filepath.Join(dir, ".state"),
		Heartbeat:    500 * time.Millisecond,
		Keepalive:    500 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond,
		ReconnectMax: 500 * time.Millisecond,
		DrainTimeout: 5 * time.Second,
		Logger:       e.log.With("component", "agent", "host", name),
	}
	// The test binary runs the git guard (TestMain calls
	// agent.RunGitGuard), as fleet-agent does.
	if exe, err := os.Executable(); err == nil {
		cfg.GitGuard = exe
	}
	if e.opts.Agent != nil {
		e.opts.Agent(&cfg)
	}
	return cfg
}

// Enrol enrols host with the gateway, with the key the Env made for it
// at its first enrolment and the labels Label gave it (else
// Options.Labels, else env=test), and returns its credential and seed.
func (e *Env) Enrol(host string) (gateway.AgentCredentials, []byte) {
	e.t.Helper()
	e.mu.Lock()
	kp := e.keys[host]
	if kp == nil {
		var err error
		if kp, err = nkeys.CreateUser(); err != nil {
			e.mu.Unlock()
			e.t.Fatal(err)
		}
		e.keys[host] = kp
	}
	labels, ok := e.labels[host]
	gw := e.Gateway
	e.mu.Unlock()
	if !ok {
		labels = map[string]string{"env": "test"}
		if e.opts.Labels != nil {
			labels = e.opts.Labels(host)
		}
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	creds, err := gw.EnrolLocal(ctx, host, pub, labels)
	if err != nil {
		e.t.Fatalf("enrol %s: %v", host, err)
	}
	return creds, slices.Clone(seed)
}

// AgentKey returns the nkey host was enrolled with (Enrol makes it).
func (e *Env) AgentKey(host string) nkeys.KeyPair {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	kp := e.keys[host]
	if kp == nil {
		e.t.Fatalf("AgentKey: %s was never enrolled", host)
	}
	return kp
}

// Label gives host labels: at its enrolments from now on, and at once if
// it is enrolled already.
func (e *Env) Label(host string, labels map[string]string) {
	e.t.Helper()
	e.mu.Lock()
	e.labels[host] = labels
	_, enrolled := e.keys[host]
	e.mu.Unlock()
	if !enrolled {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rec, err := e.Gateway.Agent(ctx, host)
	if err != nil {
		e.t.Fatal(err)
	}
	var remove []string
	for k := range rec.Labels {
		if _, ok := labels[k]; !ok {
			remove = append(remove, k)
		}
	}
	if _, err := e.Gateway.SetAgentLabels(ctx, host, labels, remove); err != nil {
		e.t.Fatalf("label %s: %v", host, err)
	}
}

// SimCredentials enrols simulated agents (package simfleet) with labels.
func (e *Env) SimCredentials(labels map[string]string) func(host string) (simfleet.Credential, error) {
	return func(host string) (simfleet.Credential, error) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return simfleet.Credential{}, err
		}
		pub, _ := kp.PublicKey()
		seed, _ := kp.Seed()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		creds, err := e.Gateway.EnrolLocal(ctx, host, pub, labels)
		if err != nil {
			return simfleet.Credential{}, err
		}
		return simfleet.Credential{JWT: creds.JWT, Seed: slices.Clone(seed), CA: creds.CAPEM}, nil
	}
}

// StartAgent starts an in-process agent; mod may adjust its config.
func (e *Env) StartAgent(name string, mod func(*agent.Config)) *agent.Agent {
	e.t.Helper()
	cfg := e.AgentConfig(name)
	if mod != nil {
		mod(&cfg)
	}
	a, err := agent.New(cfg)
	if err != nil {
		e.t.Fatalf("agent %s: %v", name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &agentRun{cancel: cancel, done: make(chan struct{}), dir: cfg.Cwd}
	go func() {
		defer close(run.done)
		_ = a.Run(ctx)
	}()
	e.mu.Lock()
	e.agents[name] = run
	e.mu.Unlock()
	return a
}

// AgentDir returns the working directory of agent name.
func (e *Env) AgentDir(name string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.agents[name]; r != nil {
		return r.dir
	}
	e.t.Fatalf("no agent %s", name)
	return ""
}

// StopAgent stops agent name gracefully (drain) and waits for it.
func (e *Env) StopAgent(name string) {
	e.mu.Lock()
	r := e.agents[name]
	delete(e.agents, name)
	e.mu.Unlock()
	if r == nil {
		return
	}
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
	} else {
		r.cancel()
	}
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		e.t.Errorf("agent %s did not stop within 30s", name)
	}
}

// StartAgentProcess runs agent name as a real fleet-agent process.
func (e *Env) StartAgentProcess(name string, extraArgs ...string) {
	e.t.Helper()
	e.startAgentProcess(name, procSpec{dir: e.t.TempDir(), extra: extraArgs})
}

// RestartAgentProcess starts agent process name again, after KillAgent or
// StopAgent, with the same arguments, working directory and state
// directory.
func (e *Env) RestartAgentProcess(name string) {
	e.t.Helper()
	e.mu.Lock()
	spec, ok := e.procs[name]
	_, running := e.agents[name]
	e.mu.Unlock()
	if !ok || running {
		e.t.Fatalf("RestartAgentProcess: %s is not a stopped agent process", name)
	}
	e.startAgentProcess(name, spec)
}

// AgentCommand returns the command that runs agent name as a real
// fleet-agent process working in dir, with its state in dir/.state
// (where the agent's identity is written, enrolled with the gateway), as
// StartAgentProcess runs it; extraArgs come last, so they may override
// any of its flags. Its stderr goes to the test log.
func (e *Env) AgentCommand(name, dir string, extraArgs ...string) *exec.Cmd {
	e.t.Helper()
	bin := AgentBinary(e.t)
	stateDir := filepath.Join(dir, ".state")
	e.WriteIdentity(name, stateDir)
	args := append([]string{"--nats", e.NATSURL(), "--cwd", dir,
		"--state_dir", stateDir, "--heartbeat", "500ms", "--log_level", "warn"}, extraArgs...)
	cmd := exec.Command(bin, args...)
	cmd.Stderr = testWriter{e.t}
	return cmd
}

// WriteIdentity enrols host and writes its identity into stateDir, as
// fleet-agent join does.
func (e *Env) WriteIdentity(host, stateDir string) {
	e.t.Helper()
	creds, seed := e.Enrol(host)
	store := identity.Open(stateDir)
	err := os.MkdirAll(store.Dir(), 0o700)
	if err == nil {
		err = os.WriteFile(filepath.Join(store.Dir(), identity.KeyFile), append(seed, '\n'), 0o600)
	}
	if err == nil {
		err = store.SaveJWT(creds.JWT)
	}
	if err == nil {
		err = store.SaveEnrolment(&identity.Enrolment{Host: host, NATSURLs: []string{e.NATSURL()}, NATSCA: string(creds.CAPEM),
			CAPin: creds.CAPin, Labels: creds.Labels, SigningKeys: creds.SigningKeys, SigningKeySerial: creds.SigningKeySerial,
			EnrolledAt: time.Now().UTC(), Expires: creds.Expires})
	}
	if err != nil {
		e.t.Fatalf("write the identity of %s: %v", host, err)
	}
}

func (e *Env) startAgentProcess(name string, spec procSpec) {
	e.t.Helper()
	dir := spec.dir
	cmd := e.AgentCommand(name, dir, spec.extra...)
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start agent process: %v", err)
	}
	run := &agentRun{done: make(chan struct{}), cmd: cmd, dir: dir}
	go func() {
		defer close(run.done)
		_ = cmd.Wait()
	}()
	e.mu.Lock()
	e.agents[name] = run
	e.procs[name] = spec
	e.mu.Unlock()
}

// RestartGateway shuts the gateway down, without waiting more than a few
// seconds for calls in flight, and starts a new one on the same MCP
// address. It needs Options.ExternalNATS: the embedded server would go
// with the gateway.
func (e *Env) RestartGateway() {
	e.t.Helper()
	if !e.opts.ExternalNATS {
		e.t.Fatal("RestartGateway needs Options.ExternalNATS")
	}
	cfg := e.gwConfig
	cfg.Listen = e.Gateway.Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = e.Gateway.Shutdown(ctx) // calls in flight are cut off
	var gw *gateway.Gateway
	var err error
	// The old listener's port may take a moment to be free again.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if gw, err = gateway.Start(context.Background(), cfg); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		e.t.Fatalf("restart gateway: %v", err)
	}
	e.mu.Lock()
	e.Gateway = gw
	e.mu.Unlock()
}

// KillAgent kills agent process name with SIGKILL: no drain, no goodbye.
func (e *Env) KillAgent(name string) {
	e.mu.Lock()
	r := e.agents[name]
	delete(e.agents, name)
	e.mu.Unlock()
	if r == nil || r.cmd == nil {
		e.t.Fatalf("KillAgent: %s is not an agent process", name)
	}
	_ = r.cmd.Process.Kill()
	<-r.done
}

// AgentPID returns the process ID of agent process name.
func (e *Env) AgentPID(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.agents[name].cmd.Process.Pid
}

// StartGateway starts another gateway replica on the external NATS
// server, configured like the first (mod may adjust that), as several
// replicas share a cluster. It is shut down with the Env.
func (e *Env) StartGateway(mod func(*gateway.Config)) *gateway.Gateway {
	e.t.Helper()
	if !e.opts.ExternalNATS {
		e.t.Fatal("StartGateway needs Options.ExternalNATS")
	}
	cfg := e.gwConfig
	e.mu.Lock()
	n := len(e.replicas) + 2
	e.mu.Unlock()
	cfg.Logger = e.log.With("component", fmt.Sprintf("gateway-%d", n))
	if mod != nil {
		mod(&cfg)
	}
	gw, err := gateway.Start(context.Background(), cfg)
	if err != nil {
		e.t.Fatalf("start gateway %d: %v", n, err)
	}
	e.mu.Lock()
	e.replicas = append(e.replicas, gw)
	e.mu.Unlock()
	return gw
}

// WaitHost waits until the gateway sees host online (or offline).
func (e *Env) WaitHost(host string, online bool) {
	e.t.Helper()
	e.WaitHostOn(e.Gateway, host, online)
}

// WaitHostOn waits until gw sees host online (or offline).
func (e *Env) WaitHostOn(gw *gateway.Gateway, host string, online bool) {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if h, ok := gw.Host(host); ok && h.Online == online {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("host %s did not become online=%v within 20s at gateway %s", host, online, gw.MCPURL())
}

func (e *Env) close() {
	e.mu.Lock()
	names := make([]string, 0, len(e.agents))
	for n := range e.agents {
		names = append(names, n)
	}
	e.mu.Unlock()
	for _, n := range names {
		e.StopAgent(n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.mu.Lock()
	gateways := append([]*gateway.Gateway{e.Gateway}, e.replicas...)
	e.mu.Unlock()
	for _, gw := range gateways {
		if err := gw.Shutdown(ctx); err != nil {
			e.t.Errorf("gateway shutdown: %v", err)
		}
	}
	if e.opts.ExternalNATS {
		e.StopNATS()
	}
}

// AgentBinary builds cmd/fleet-agent once per test binary.
func AgentBinary(t testing.TB) string { return agentCommand.binary(t) }

// testWriter sends log lines to the test log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// AgentConn connects to NATS with host's credential (enrolling it with
// its key), as its agent would, with the agent's inbox prefix and opts.
func (e *Env) AgentConn(host string, opts ...nats.Option) (*nats.Conn, error) {
	e.t.Helper()
	creds, seed := e.Enrol(host)
	all := []nats.Option{nats.UserJWTAndSeed(creds.JWT, string(seed)), nats.CustomInboxPrefix(protocol.AgentInboxPrefix(host))}
	if len(creds.CAPEM) > 0 {
		all = append(all, AgentTLS(creds.CAPEM))
	}
	nc, err := nats.Connect(e.NATSURL(), append(all, opts...)...)
	if err == nil {
		e.t.Cleanup(nc.Close)
	}
	return nc, err
}

// agentTLS trusts caPEM alone, as agents do.
func AgentTLS(caPEM []byte) nats.Option {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
}

// startRevoker runs the cluster's revoker until the test ends, and waits
// until it answers.
func (e *Env) startRevoker() {
	f := gateway.NATSSetupFiles
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- natsauth.RunRevoker(ctx, natsauth.RevokerConfig{NATSURLs: []string{e.NATSURL()},
			CredsFile: filepath.Join(e.setup, f.GatewayCreds), SystemCredsFile: filepath.Join(e.setup, f.SystemCreds),
			AgentSigningKeyFile: filepath.Join(e.setup, f.AgentSigningKey), OperatorSigningKeyFile: filepath.Join(e.setup, f.OperatorSigningKey),
			Logger: e.log.With("component", "revoker")})
	}()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			e.t.Errorf("revoker: %v", err)
		}
	})
	nc, err := nats.Connect(e.NATSURL(), nats.UserCredentials(filepath.Join(e.setup, f.GatewayCreds)))
	if err != nil {
		e.t.Fatal(err)
	}
	defer nc.Close()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := nc.Request(protocol.RevokerSubject(), []byte(`{"keys":{}}`), time.Second); err == nil {
			return
		} else if time.Now().After(deadline) {
			e.t.Fatalf("the revoker does not answer: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
