// Package simfleet runs many simulated agents in one process, for load
// tests of the gateway and for scenarios with more hosts than real agents
// can run on one machine. Each simulated agent is a real NATS client with
// its own connection and credential, speaks the real wire protocol
// (announce, heartbeat, calls answered with protocol.Result values in
// numbered frames, fetch of finished results), and reconnects with the
// agent's own backoff (agent.ReconnectDelay). It checks every call's,
// fetch's and poke's signed envelope as an agent does (agent/callauth:
// the gateway keys it trusts, its host, the clock, a replay cache), and
// signs every result's receipt with its own key, so that a fleet of them
// costs the gateway and the hosts what real ones do. What it does not do
// is run anything: bash and read are answered by a Handler, by default a
// tiny table of commands and files, so thousands cost little CPU and
// memory.
//
// To stay light, all agents share a few worker goroutines: each agent's
// subscriptions deliver into one shared channel (nats.ChanSubscribe), so
// an agent costs its connection's own goroutines and buffers only.
package simfleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/agent"
	"github.com/fleetmcp/fleetmcp/agent/callauth"
	"github.com/fleetmcp/fleetmcp/protocol"
)

// Handler answers one call of a simulated host. It runs on a shared
// worker and must not block for long; Config.Delay simulates slow hosts.
type Handler func(host string, call *protocol.Call) *protocol.Result

// Config describes a simulated fleet.
type Config struct {
	// URL is the NATS server the agents dial.
	URL string
	// Hosts are the agents' host names.
	Hosts []string
	// Credentials returns the NATS credential of a host, as its
	// enrolment gives it (nil: no authentication). It is called for every
	// host before any connects, up to DialConcurrency at once.
	Credentials func(host string) (Credential, error)
	// Heartbeat is how often each agent announces itself. Default 5 s,
	// as real agents do; the agents' heartbeats are spread over it.
	Heartbeat time.Duration
	// ReconnectMin and ReconnectMax bound the reconnect backoff, as the
	// agent's settings of the same names do. Defaults: the agent's.
	ReconnectMin, ReconnectMax time.Duration
	// Handler answers calls. Default: DefaultHandler(nil).
	Handler Handler
	// Delay is added before every answer.
	Delay time.Duration
	// Workers handle calls for all agents. Default 8.
	Workers int
	// DialConcurrency bounds agents connecting at once at Start.
	// Default 64.
	DialConcurrency int
	// Logger receives connection trouble. Default: discarded.
	Logger *slog.Logger
	// SigningKeys are the gateway keys the agents trust (required): they
	// refuse whatever these did not sign.
	SigningKeys []string
	// Skills makes the agents take part in skill rollout (skills.go).
	Skills bool
	// SkillConcurrency bounds agents syncing their skills at once.
	// Default 256.
	SkillConcurrency int
}

// Credential is a simulated agent's NATS identity: its user JWT and nkey
// seed, and the CA of the servers' certificates (empty: no TLS).
type Credential struct {
	JWT  string
	Seed []byte
	CA   []byte
}

// Fleet is a running simulated fleet.
type Fleet struct {
	cfg    Config
	agents []*simAgent
	bySub  sync.Map // *nats.Subscription -> *simAgent
	msgs   chan *nats.Msg
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	done   *resultCache
	// skillSem bounds skill syncs at once.
	skillSem chan struct{}

	// Calls counts calls answered; Conns the TCP connections the agents
	// made (each a handshake the server began: more than the agents
	// after a reconnect storm means handshakes failed and were tried
	// again).
	Calls atomic.Int64
	Conns atomic.Int64

	errMu     sync.Mutex
	reconnErr map[string]int
	refusals  map[string]int
}

type simAgent struct {
	f        *Fleet
	host     string
	cred     Credential
	announce []byte // the announce, encoded once
	// auth checks envelopes; receipts signs results (nil without a
	// credential: results then carry no receipt, which gateways refuse).
	auth     *callauth.Verifier
	receipts *callauth.ReceiptSigner
	mu       sync.Mutex
	nc       *nats.Conn
	beat     *time.Timer
	// reconnected is when the agent last rejoined after losing its
	// connection (zero: never).
	reconnected atomic.Int64
	connected   atomic.Bool
	sk          skillState
}

// Start connects every agent and waits until each has subscribed and
// announced itself (or ctx ends).
func Start(ctx context.Context, cfg Config) (*Fleet, error) {
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 5 * time.Second
	}
	if cfg.ReconnectMin == 0 {
		cfg.ReconnectMin = agent.DefaultReconnectMin
	}
	if cfg.ReconnectMax == 0 {
		cfg.ReconnectMax = agent.DefaultReconnectMax
	}
	if cfg.Handler == nil {
		cfg.Handler = DefaultHandler(nil)
	}
	if cfg.Workers == 0 {
		cfg.Workers = 8
	}
	if cfg.DialConcurrency == 0 {
		cfg.DialConcurrency = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SkillConcurrency == 0 {
		cfg.SkillConcurrency = 256
	}
	if len(cfg.SigningKeys) == 0 {
		return nil, errors.New("simulated agents check the gateway's signatures: give Config.SigningKeys")
	}
	fctx, cancel := context.WithCancel(context.Background())
	f := &Fleet{cfg: cfg, msgs: make(chan *nats.Msg, 1<<16), ctx: fctx, cancel: cancel, done: newResultCache(1 << 17),
		skillSem: make(chan struct{}, cfg.SkillConcurrency)}
	started := time.Now().UTC()
	keys := protocol.KeyState{Keys: cfg.SigningKeys}
	for _, h := range cfg.Hosts {
		instance := randomID()
		auth, err := callauth.New(callauth.Config{Host: h, Instance: instance, Keys: keys, Started: started})
		if err != nil {
			cancel()
			return nil, err
		}
		a := &simAgent{f: f, host: h, auth: auth, sk: skillState{active: map[string]string{}, states: map[string]protocol.SkillState{}}}
		a.announce = mustJSON(protocol.Announce{
			Host: h, Instance: instance, Protocol: protocol.Version, AgentVersion: "sim",
			OS: "linux", Arch: "amd64", Cwd: "/sim/" + h, Shell: "/bin/bash", Tools: []string{"bash", "read"},
			TrustedKeys: auth.KeyIDs(), StartedAt: started, HeartbeatMS: cfg.Heartbeat.Milliseconds(), Limit: 16,
		})
		f.agents = append(f.agents, a)
	}
	for range cfg.Workers {
		f.wg.Go(f.worker)
	}
	if cfg.Credentials != nil {
		if err := f.each(func(a *simAgent) (err error) {
			a.cred, err = cfg.Credentials(a.host)
			if err != nil {
				return fmt.Errorf("credential of simulated agent %s: %w", a.host, err)
			}
			if len(a.cred.Seed) > 0 {
				if a.receipts, err = callauth.NewReceiptSigner(a.cred.Seed); err != nil {
					return fmt.Errorf("simulated agent %s: %w", a.host, err)
				}
			}
			return nil
		}); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := f.each((*simAgent).dial); err != nil {
		f.Close()
		return nil, err
	}
	f.startHeartbeats()
	return f, nil
}

// each runs do for every agent, DialConcurrency at once, and returns the
// first error with how many failed.
func (f *Fleet) each(do func(*simAgent) error) error {
	sem := make(chan struct{}, f.cfg.DialConcurrency)
	errs := make(chan error, len(f.agents))
	var wg sync.WaitGroup
	for _, a := range f.agents {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs <- do(a)
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		if err != nil {
			all = append(all, err)
		}
	}
	if len(all) > 0 {
		return fmt.Errorf("%d of %d simulated agents failed; first: %w", len(all), len(f.agents), all[0])
	}
	return nil
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return data
}

func randomID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// dial connects the agent, subscribes and announces.
func (a *simAgent) dial() error {
	cfg := &a.f.cfg
	opts := []nats.Option{
		nats.Name("fleet-sim " + a.host),
		nats.SetCustomDialer(&oneConnDialer{d: net.Dialer{Timeout: agent.DialTimeout}, made: &a.f.Conns}),
		nats.Timeout(agent.HandshakeTimeout),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(func(attempts int) time.Duration {
			return agent.ReconnectDelay(attempts, cfg.ReconnectMin, cfg.ReconnectMax)
		}),
		nats.PingInterval(10 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.CustomInboxPrefix(protocol.AgentInboxPrefix(a.host)),
		// Announces are skipped while disconnected; nothing else is
		// published then, so no reconnect buffer is needed.
		nats.ReconnectBufSize(-1),
		nats.WriteBufferSize(4 << 10),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { a.connected.Store(false) }),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			a.reconnected.Store(time.Now().UnixNano())
			a.connected.Store(true)
			a.publishAnnounce(nc)
			a.skillsPoke()
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			a.connected.Store(false)
			if a.f.ctx.Err() == nil {
				a.f.reconnectFailed(fmt.Errorf("connection closed for good: %v", nc.LastError()))
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { a.f.reconnectFailed(err) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			cfg.Logger.Warn("NATS error", "host", a.host, "err", err)
		}),
	}
	if a.cred.JWT != "" {
		opts = append(opts, nats.UserJWTAndSeed(a.cred.JWT, string(a.cred.Seed)))
	}
	if len(a.cred.CA) > 0 {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(a.cred.CA)
		opts = append(opts, nats.Secure(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	var nc *nats.Conn
	var err error
	for attempt := 1; ; attempt++ {
		nc, err = nats.Connect(cfg.URL, opts...)
		if err == nil {
			break
		}
		if a.f.ctx.Err() != nil || attempt >= 20 {
			return fmt.Errorf("simulated agent %s: %w", a.host, err)
		}
		time.Sleep(agent.ReconnectDelay(attempt, cfg.ReconnectMin, cfg.ReconnectMax))
	}
	for _, subj := range []string{protocol.HostSubjects(a.host), protocol.DiscoverSubject()} {
		sub, err := nc.ChanSubscribe(subj, a.f.msgs)
		if err != nil {
			nc.Close()
			return fmt.Errorf("simulated agent %s: subscribe: %w", a.host, err)
		}
		a.f.bySub.Store(sub, a)
	}
	if err := nc.Flush(); err != nil {
		nc.Close()
		return fmt.Errorf("simulated agent %s: %w", a.host, err)
	}
	a.mu.Lock()
	a.nc = nc
	a.mu.Unlock()
	a.connected.Store(true)
	a.publishAnnounce(nc)
	a.skillsPoke()
	return nil
}

// oneConnDialer dials an agent's connections and closes the one before
// each time: nats.go leaves the socket of a failed handshake to the
// garbage collector, and in a reconnect storm thousands of agents in one
// process would otherwise run out of file descriptors long before it
// runs. An agent has one connection at a time, so the one before is
// always dead when a new one is dialled.
type oneConnDialer struct {
	mu   sync.Mutex
	last net.Conn
	d    net.Dialer
	made *atomic.Int64 // counts the connections made
}

func (o *oneConnDialer) Dial(network, address string) (net.Conn, error) {
	o.mu.Lock()
	if o.last != nil {
		o.last.Close()
		o.last = nil
	}
	o.mu.Unlock()
	c, err := o.d.Dial(network, address)
	if err != nil {
		return nil, err
	}
	o.made.Add(1)
	o.mu.Lock()
	o.last = c
	o.mu.Unlock()
	return c, nil
}

func (a *simAgent) conn() *nats.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nc
}

func (a *simAgent) publishAnnounce(nc *nats.Conn) {
	if nc != nil && nc.IsConnected() {
		_ = nc.Publish(protocol.PresenceSubject(a.host), a.announce)
	}
}

// startHeartbeats announces every agent once per Heartbeat, the agents
// spread evenly over it. Each agent has its own timer, as each real agent
// has its own heartbeat, so one stalled connection delays no other.
func (f *Fleet) startHeartbeats() {
	for i, a := range f.agents {
		offset := f.cfg.Heartbeat * time.Duration(i) / time.Duration(len(f.agents))
		a.mu.Lock()
		a.beat = time.AfterFunc(offset, a.heartbeat)
		a.mu.Unlock()
	}
}

func (a *simAgent) heartbeat() {
	if a.f.ctx.Err() != nil {
		return
	}
	a.publishAnnounce(a.conn())
	a.mu.Lock()
	a.beat.Reset(a.f.cfg.Heartbeat)
	a.mu.Unlock()
}

func (f *Fleet) worker() {
	for {
		select {
		case <-f.ctx.Done():
			return
		case m := <-f.msgs:
			v, ok := f.bySub.Load(m.Sub)
			if !ok {
				continue
			}
			v.(*simAgent).handle(m)
		}
	}
}

func (a *simAgent) handle(m *nats.Msg) {
	switch {
	case m.Subject == protocol.DiscoverSubject():
		a.publishAnnounce(a.conn())
	case m.Subject == protocol.SkillsPokeSubject(a.host):
		if _, err := a.auth.OpenBody(m.Header.Get(protocol.HeaderAuth), callauth.Expect{Kind: protocol.MsgPoke, Reply: m.Reply}, m.Data); err != nil {
			a.f.refused(err)
			return
		}
		a.skillsPoke()
	case m.Subject == protocol.CallSubject(a.host):
		a.onCall(m)
	case m.Subject == protocol.FetchSubject(a.host):
		claims, err := a.auth.OpenBody(m.Header.Get(protocol.HeaderAuth), callauth.Expect{Kind: protocol.MsgFetch, Reply: m.Reply}, m.Data)
		if err != nil {
			a.f.refused(err)
			return
		}
		var fe protocol.Fetch
		if json.Unmarshal(m.Data, &fe) != nil || fe.CallID != claims.CallID || m.Reply == "" {
			return
		}
		if r := a.f.done.get(fe.CallID); r != nil {
			a.publishResult(m.Reply, fe.CallID, r.data, r.receipt)
			return
		}
		a.reply(m.Reply, protocol.ErrorResult(fe.CallID, protocol.CodeUnknownCall, fmt.Sprintf("simulated host %s has no record of call %s", a.host, fe.CallID)))
	}
	// Cancels need nothing: a simulated call is over at once.
}

func (a *simAgent) onCall(m *nats.Msg) {
	fr, err := protocol.DecodeFrame(protocol.Header(m.Header), m.Data)
	if err != nil || fr.Kind != protocol.KindCall || m.Reply == "" {
		return
	}
	if fr.Parts != 1 {
		a.f.refused(errors.New("simulated agents take single-part calls only"))
		return
	}
	claims, err := a.auth.OpenBody(fr.Auth, callauth.Expect{Kind: protocol.MsgCall, Reply: m.Reply, CallID: fr.CallID}, fr.Data)
	if err != nil {
		a.f.refused(err)
		return
	}
	var call protocol.Call
	if err := json.Unmarshal(fr.Data, &call); err != nil {
		a.reply(m.Reply, protocol.ErrorResult(fr.CallID, protocol.CodeBadRequest, "call is not valid JSON: "+err.Error()))
		return
	}
	if call.ID != claims.CallID || call.Host != a.host || call.Tool != claims.Tool {
		a.reply(m.Reply, protocol.ErrorResult(fr.CallID, protocol.CodeBadRequest, "call does not match its envelope"))
		return
	}
	start := time.Now()
	answer := func() {
		res := a.f.cfg.Handler(a.host, &call)
		res.CallID = call.ID
		data, err := protocol.EncodeResult(res)
		if err != nil {
			res = protocol.ErrorResult(call.ID, protocol.CodeInternal, err.Error())
			data, _ = protocol.EncodeResult(res)
		}
		receipt := a.receipt(res, data, start)
		a.f.done.put(call.ID, data, receipt)
		a.publishResult(m.Reply, call.ID, data, receipt)
		a.f.Calls.Add(1)
	}
	if d := a.f.cfg.Delay; d > 0 {
		time.AfterFunc(d, answer)
		return
	}
	answer()
}

func (a *simAgent) reply(reply string, res *protocol.Result) {
	data, _ := protocol.EncodeResult(res)
	a.publishResult(reply, res.CallID, data, a.receipt(res, data, time.Now()))
}

// receipt signs the receipt of res, encoded as data ("" without a key).
func (a *simAgent) receipt(res *protocol.Result, data []byte, start time.Time) string {
	if a.receipts == nil {
		return ""
	}
	var exit *int
	if st := simExit(res); st >= 0 {
		exit = &st
	}
	h, _ := a.receipts.Sign(a.host, res, data, start, time.Now(), exit)
	return h
}

// publishResult sends an encoded result in numbered parts, as agents do,
// its receipt with the last.
func (a *simAgent) publishResult(reply, id string, data []byte, receipt string) {
	nc := a.conn()
	if nc == nil {
		return
	}
	size := protocol.ChunkSize
	if mp := nc.MaxPayload(); mp > 0 {
		size = int(max(min(int64(size), mp-1024), 1024))
	}
	parts, err := protocol.Split(data, size)
	if err != nil {
		return
	}
	for i, p := range parts {
		f := protocol.Frame{Kind: protocol.KindResult, CallID: id, Seq: uint64(i + 1), Part: i + 1, Parts: len(parts), Data: p}
		if i == len(parts)-1 {
			f.Receipt = receipt
		}
		h, body := f.Encode()
		if nc.PublishMsg(&nats.Msg{Subject: reply, Header: nats.Header(h), Data: body}) != nil {
			return
		}
	}
}

// Close disconnects every agent and stops the workers.
func (f *Fleet) Close() {
	f.cancel()
	for _, a := range f.agents {
		a.mu.Lock()
		if a.beat != nil {
			a.beat.Stop()
		}
		a.mu.Unlock()
		if nc := a.conn(); nc != nil {
			nc.Close()
		}
	}
	f.wg.Wait()
}

// refused counts a message a simulated agent refused, by reason.
func (f *Fleet) refused(err error) {
	reason := "malformed"
	var ee *protocol.EnvelopeError
	if errors.As(err, &ee) {
		reason = string(ee.Reason)
	}
	f.errMu.Lock()
	defer f.errMu.Unlock()
	if f.refusals == nil {
		f.refusals = make(map[string]int)
	}
	f.refusals[reason]++
}

// Refusals counts the messages the simulated agents refused, by reason.
func (f *Fleet) Refusals() map[string]int {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	return maps.Clone(f.refusals)
}

func (f *Fleet) reconnectFailed(err error) {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	if f.reconnErr == nil {
		f.reconnErr = make(map[string]int)
	}
	f.reconnErr[err.Error()]++
}

// ReconnectErrors counts failed reconnect attempts by error, and resets
// the counts.
func (f *Fleet) ReconnectErrors() map[string]int {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	m := f.reconnErr
	f.reconnErr = nil
	return m
}

// Connected counts agents connected right now.
func (f *Fleet) Connected() int {
	n := 0
	for _, a := range f.agents {
		if a.connected.Load() {
			n++
		}
	}
	return n
}

// ReconnectedSince returns, for every agent that rejoined after t, when
// it did (unsorted).
func (f *Fleet) ReconnectedSince(t time.Time) []time.Time {
	var out []time.Time
	for _, a := range f.agents {
		if ns := a.reconnected.Load(); ns > t.UnixNano() {
			out = append(out, time.Unix(0, ns))
		}
	}
	return out
}

// Kill closes the connections of hosts without a goodbye, as a crashed
// machine would; they do not come back.
func (f *Fleet) Kill(hosts ...string) {
	for _, a := range f.agents {
		for _, h := range hosts {
			if a.host == h {
				if nc := a.conn(); nc != nil {
					nc.Close()
				}
			}
		}
	}
}

// resultCache keeps finished results for fetches, the newest max, in a
// ring.
type resultCache struct {
	mu   sync.Mutex
	data map[string]cachedResult
	ring []string
	next int
}

// cachedResult is an encoded result and its receipt.
type cachedResult struct {
	data    []byte
	receipt string
}

func newResultCache(max int) *resultCache {
	return &resultCache{data: make(map[string]cachedResult), ring: make([]string, max)}
}

func (c *resultCache) put(id string, data []byte, receipt string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.ring[c.next]; old != "" {
		delete(c.data, old)
	}
	c.ring[c.next] = id
	c.next = (c.next + 1) % len(c.ring)
	c.data[id] = cachedResult{data: data, receipt: receipt}
}

func (c *resultCache) get(id string) *cachedResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.data[id]
	if !ok {
		return nil
	}
	return &r
}

// DefaultHandler answers like an unrestricted agent whose file system
// holds files (path → content) and whose shell knows only a few
// commands: true, false, exit N, echo WORDS and hostname. Anything else
// exits with 127, so nobody mistakes a simulated result for a real one.
// read returns the content with its SHA-256 as structured content, as
// agents do.
func DefaultHandler(files map[string]string) Handler {
	return func(host string, call *protocol.Call) *protocol.Result {
		switch call.Tool {
		case "read":
			var args struct {
				Path string `json:"path"`
			}
			_ = json.Unmarshal(call.Args, &args)
			content, ok := files[args.Path]
			if !ok {
				return &protocol.Result{IsError: true, Content: []protocol.Content{protocol.Text(args.Path + ": no such file")}}
			}
			return ReadResult(content)
		case "bash":
			var args struct {
				Command string `json:"command"`
			}
			_ = json.Unmarshal(call.Args, &args)
			return simulatedShell(host, args.Command)
		}
		return protocol.ErrorResult(call.ID, protocol.CodeUnknownTool, fmt.Sprintf("simulated host %s does not serve tool %q", host, call.Tool))
	}
}

// ReadResult is a read tool's result for content, with its SHA-256.
func ReadResult(content string) *protocol.Result {
	sum := sha256.Sum256([]byte(content))
	text := content
	if text == "" {
		text = "(empty file)"
	}
	return &protocol.Result{
		Content:    []protocol.Content{protocol.Text(text)},
		Structured: mustJSON(map[string]string{"sha256": hex.EncodeToString(sum[:])}),
	}
}

// simExit returns the exit status a simulated result states (-1: none).
func simExit(res *protocol.Result) int {
	if res.Error != nil || len(res.Content) == 0 {
		return -1
	}
	if !res.IsError {
		return 0
	}
	text := res.Content[len(res.Content)-1].Text
	if i := strings.LastIndex(text, "Command exited with code "); i >= 0 {
		if n, err := strconv.Atoi(strings.TrimSpace(text[i+len("Command exited with code "):])); err == nil {
			return n
		}
	}
	return -1
}

// BashResult is a bash tool's result for output and exit code, worded as
// the bash tool words it.
func BashResult(output string, exit int) *protocol.Result {
	if output == "" {
		output = "(no output)"
	}
	if exit == 0 {
		return &protocol.Result{Content: []protocol.Content{protocol.Text(output)}}
	}
	return &protocol.Result{IsError: true, Content: []protocol.Content{protocol.Text(output + "\n\nCommand exited with code " + strconv.Itoa(exit))}}
}

func simulatedShell(host, command string) *protocol.Result {
	fields := strings.Fields(command)
	if len(fields) == 0 {
		return BashResult("", 0)
	}
	switch fields[0] {
	case "true":
		return BashResult("", 0)
	case "false":
		return BashResult("", 1)
	case "hostname":
		return BashResult(host+"\n", 0)
	case "echo":
		return BashResult(strings.Join(fields[1:], " ")+"\n", 0)
	case "exit":
		n := 0
		if len(fields) > 1 {
			n, _ = strconv.Atoi(fields[1])
		}
		return BashResult("", n)
	}
	return BashResult("bash: "+fields[0]+": command not found (simulated agent)\n", 127)
}
