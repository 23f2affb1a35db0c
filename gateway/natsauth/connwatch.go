package natsauth

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file watches the fleet account's NATS connections for two live
// connections on one host's identity: someone who copied a host's seed
// and credential can connect beside its agent without ever announcing,
// and would then receive every call to the host and could answer first.
// Announces cannot show that (the gateway's registry); the NATS servers can.
//
// Two sources, both cluster-wide:
//   - the servers' connect and disconnect events
//     ($SYS.ACCOUNT.<fleet>.CONNECT / .DISCONNECT), which the system
//     user hears from every server of a cluster (the system account spans
//     the cluster); they trigger a look within milliseconds;
//   - account-scoped connz ($SYS.REQ.ACCOUNT.PING.CONNZ, which the NATS
//     server imports into every account: the gateway's own fleet-account
//     user asks it, and every server answers for its own connections).
//     It is the authority the verdict is taken from, at start (a copy
//     connected before the gateway started), every connzEvery (events
//     lost while the system connection was down, a server that died
//     without sending disconnects), and whenever the events show a host
//     with two connections.
//
// Only users issued by the agent signing key count (enrol credentials
// and the gateway's own users are signed by other keys), and a
// connection belongs to the host its key is enrolled for (else to the
// host its credential names).
//
// Not every overlap is a copy. An agent that restarts (killed and started
// again, a service restart) closes its socket, and the server's
// disconnect event follows within milliseconds: so two connections are
// judged only once both have been open connGrace (3 s). An agent that
// moved network leaves its old link open on the server until the
// server's pings fail (minutes with the default ping interval), while
// its new link carries its heartbeats: so an older connection from which
// the server has received nothing for longer than two of the host's
// heartbeats (by its idle time, and by its count of received messages
// standing still across connz answers, since calls delivered to a dead
// link reset its idle time) is taken for a dead link and excused, for as
// long as a server takes to close a dead link; a connection still there
// after that answers the server's pings and is alive. That bound is read
// from the servers (varz: their ping interval and unanswered pings
// allowed), so it follows an operator's settings: 6 minutes with
// nats-server's defaults. The newest connection is never excused: a copy
// that connects beside a live agent is judged on the agent's activity,
// which its heartbeats keep recent. The price: a copy that connected
// first and keeps silent is found only after that bound once the agent
// restarts beside it.
//
// The grace alone could be evaded: a copy that closes each connection
// within it (and opens the next one before, or after a pause) is never
// two connections judged, yet hears calls while it is there. So the
// watch also judges how links end. A restart or a move ends the OLDER
// link (the old process, the dead link) and keeps the newer one; one
// agent process never holds two links. A NEWER link that closes while
// an older one stays open and active (not silent for two heartbeats) is
// therefore a second client's: each such close is a strike against the
// host, and churnStrikes of them within churnWindow are a conflict,
// however short each link was. The price: an agent whose new link drops
// twice within churnWindow while its old link, dead but not yet silent
// for two heartbeats, is still on the server (a network flap right after
// a move) is taken for a copy too.

const (
	// connGrace is how long two connections on one identity must both
	// have been open before they are judged.
	connGrace = 3 * time.Second
	// connStaleSlack is added to the time a server takes to close a dead
	// link (staleBoundOf) before a silent older connection stops being
	// excused.
	connStaleSlack = 15 * time.Second
	// connzEvery is the period of the full connz reconcile.
	connzEvery = 30 * time.Second
	// connCheckEvery is how often hosts with two connections are looked
	// at again.
	connCheckEvery = 500 * time.Millisecond
	// connzWait bounds one connz round; roundQuiet ends it once no
	// server has answered for that long.
	connzWait  = 2 * time.Second
	roundQuiet = 300 * time.Millisecond
	// connCheckMany is the number of hosts to look at beyond which one
	// list of the account replaces the lists of each host's keys.
	connCheckMany = 8
	// goneFor is how long a closed connection is kept from coming
	// back (connWatch.gone): longer than any connz round or event
	// delay, shorter than the next reconcile but one.
	goneFor = 2 * time.Minute
	// DefaultAgentHeartbeat is an agent's heartbeat when the gateway
	// has not heard its own yet.
	DefaultAgentHeartbeat = 5 * time.Second
	// churnStrikes newer links closed beside an older active one within
	// churnWindow are a conflict (see the file comment). The window is
	// long because a strike needs an older link that is active, which an
	// agent's own dead link stops being after two heartbeats.
	churnStrikes = 2
	churnWindow  = 10 * time.Minute
)

// Conn is one connection on an agent identity, as a server reported it.
type Conn struct {
	Server string    `json:"server"`
	CID    uint64    `json:"cid"`
	User   string    `json:"key"`
	IP     string    `json:"ip,omitempty"`
	Start  time.Time `json:"start"`
	// last is the server's last activity on it (zero: not known yet,
	// from an event only); seen when this gateway first saw it.
	last time.Time
	seen time.Time
	host string
	// in counts the messages the server received on it, as the last
	// connz said (sampled: whether connz said it), and inSince is when
	// this gateway first saw that count: it stood still since then.
	in      int64
	sampled bool
	inSince time.Time
	// Closed is when this gateway saw it close (zero: open), for a link
	// that closed beside an older one.
	Closed time.Time `json:"closed,omitzero"`
}

// quiet returns how long, at now, nothing is known to have come from c:
// the longer of the server's idle time (which deliveries to it reset
// too) and how long its count of received messages stood still.
func (c *Conn) quiet(now time.Time) time.Duration {
	var q time.Duration
	if !c.last.IsZero() {
		q = now.Sub(c.last)
	}
	if !c.inSince.IsZero() {
		q = max(q, now.Sub(c.inSince))
	}
	return q
}

type connID struct {
	server string
	cid    uint64
}

func (c *Conn) id() connID { return connID{c.Server, c.CID} }

func (c *Conn) String() string {
	s := fmt.Sprintf("server %s connection %d from %s since %s", protocol.Clip(c.Server, 12), c.CID, c.IP, c.Start.UTC().Format(time.RFC3339))
	if !c.Closed.IsZero() {
		s += " closed " + c.Closed.UTC().Format(time.RFC3339)
	}
	return s
}

// judge decides, at now, whether a host's connections are a conflict.
// It returns the connections that count (two or more: a conflict) and
// whether to look again later (some are too new, or excused as a dead
// link). silent is how long without activity makes an older connection
// a dead link (see the file comment).
func judge(conns []Conn, now time.Time, grace, silent, staleBound time.Duration) (counted []Conn, again bool) {
	if len(conns) < 2 {
		return nil, false
	}
	newest := 0
	for i := range conns {
		if conns[i].Start.After(conns[newest].Start) {
			newest = i
		}
	}
	for i, c := range conns {
		if now.Sub(c.seen) < grace {
			again = true
			continue
		}
		if i != newest {
			if q := c.quiet(now); q > silent && q <= staleBound {
				again = true
				continue
			}
		}
		counted = append(counted, c)
	}
	if len(counted) < 2 {
		return nil, again
	}
	return counted, false
}

// connWatch keeps the agent connections the servers report and tells
// found about each conflict.
type connWatch struct {
	log        *slog.Logger
	accountPub string
	signerPub  string
	// sys hears the events; nc asks connz.
	sys, nc *nats.Conn
	// hostOf returns the host a key is enrolled for; silentAfter how long
	// without activity makes a host's older connection a dead link.
	hostOf      func(user string) (string, bool)
	silentAfter func(host string) time.Duration
	// found is told each conflict (every look while it lasts: it must
	// keep its own record of what it already knows).
	found func(ctx context.Context, host string, conns []Conn)
	// standing reports whether host's conflict was found already and
	// stands: it is not looked at again.
	standing func(host string) bool
	now      func() time.Time

	mu     sync.Mutex
	byHost map[string]map[connID]*Conn
	// seen keeps when each connection was first seen, across connz
	// rounds.
	seen map[connID]time.Time
	// gone keeps, for goneFor, the connections known closed: the
	// connect and disconnect events come on two subscriptions, so a
	// connect may be handled after its own disconnect, and a connz
	// answer may predate a close; neither may bring a closed
	// connection back, where it would pass for an older live link.
	gone map[connID]time.Time
	// strikes are each host's newer links that closed beside an older
	// active one, within churnWindow; churned the hosts whose strikes
	// made a conflict, with the connections that show it, until the loop
	// tells found.
	strikes map[string][]Conn
	churned map[string][]Conn
	wake    chan struct{}
	subs    []*nats.Subscription
	// page is the connections asked of each server at once (connzPage).
	page int
	// staleBound is how long a silent older connection is excused (see
	// staleBoundOf); guarded by mu.
	staleBound time.Duration
}

// staleBoundOf is how long after the last message it received a server
// closes a dead link: it pings a connection that sent nothing for its
// ping interval, at each tick of it, and closes the connection at the
// tick that finds maxOut pings unanswered; plus connStaleSlack.
func staleBoundOf(ping time.Duration, maxOut int) time.Duration {
	return time.Duration(maxOut+1)*ping + connStaleSlack
}

// refreshStaleBound reads the servers' ping settings, keeping the longest
// bound any server gives.
func (w *connWatch) refreshStaleBound(ctx context.Context) {
	msgs, err := gather(ctx, w.sys, "$SYS.REQ.SERVER.PING.VARZ", nil)
	if err != nil {
		w.log.Debug("cannot read the servers' ping settings", "err", err)
		return
	}
	bound := time.Duration(0)
	for _, m := range msgs {
		var r struct {
			Data *server.Varz `json:"data"`
		}
		if json.Unmarshal(m.Data, &r) == nil && r.Data != nil && r.Data.PingInterval > 0 {
			bound = max(bound, staleBoundOf(r.Data.PingInterval, r.Data.MaxPingsOut))
		}
	}
	if bound > 0 {
		w.mu.Lock()
		w.staleBound = bound
		w.mu.Unlock()
	}
}

func newConnWatch(log *slog.Logger, accountPub, signerPub string, sys, nc *nats.Conn) *connWatch {
	return &connWatch{log: log, accountPub: accountPub, signerPub: signerPub, sys: sys, nc: nc, now: time.Now,
		hostOf:      func(string) (string, bool) { return "", false },
		silentAfter: func(string) time.Duration { return 2*DefaultAgentHeartbeat + time.Second },
		found:       func(context.Context, string, []Conn) {},
		standing:    func(string) bool { return false },
		byHost:      make(map[string]map[connID]*Conn), seen: make(map[connID]time.Time), gone: make(map[connID]time.Time), wake: make(chan struct{}, 1), page: connzPage,
		strikes: make(map[string][]Conn), churned: make(map[string][]Conn),
		staleBound: staleBoundOf(server.DEFAULT_PING_INTERVAL, server.DEFAULT_PING_MAX_OUT)}
}

// subscribe starts hearing the servers' connect and disconnect events.
func (w *connWatch) subscribe() error {
	for _, kind := range []string{"CONNECT", "DISCONNECT"} {
		subject := fmt.Sprintf("$SYS.ACCOUNT.%s.%s", w.accountPub, kind)
		sub, err := w.sys.Subscribe(subject, w.onEvent)
		if err != nil {
			w.unsubscribe()
			return fmt.Errorf("subscribe to %s: %w", subject, err)
		}
		w.subs = append(w.subs, sub)
	}
	return nil
}

func (w *connWatch) unsubscribe() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
	w.subs = nil
}

// connEvent is the part of a connect or disconnect event the watch
// reads.
type connEvent struct {
	Type   string            `json:"type"`
	Server server.ServerInfo `json:"server"`
	Client server.ClientInfo `json:"client"`
}

// onEvent records a connect or disconnect (on the subscription's
// goroutine: it only updates the map and wakes the loop).
func (w *connWatch) onEvent(m *nats.Msg) {
	var ev connEvent
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		return
	}
	ci := &ev.Client
	if ci.IssuerKey != w.signerPub || ci.Account != w.accountPub {
		return
	}
	c := Conn{Server: ev.Server.ID, CID: ci.ID, User: ci.User, IP: ci.Host}
	if ci.Start != nil {
		c.Start = *ci.Start
	}
	host, ok := w.host(ci.User, ci.Jwt)
	if !ok {
		return
	}
	c.host = host
	w.mu.Lock()
	defer w.mu.Unlock()
	if ev.Type == server.DisconnectEventMsgType {
		w.closed(host, c.id())
		w.gone[c.id()] = w.now() // also when its connect is yet to come
		return
	}
	if w.add(c) >= 2 {
		w.poke()
	}
}

// host returns the host a connection of user, whose credential is
// token, belongs to.
func (w *connWatch) host(user, token string) (string, bool) {
	if h, ok := w.hostOf(user); ok {
		return h, true
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil || uc.Subject != user || protocol.ValidateHost(uc.Name) != nil {
		return "", false
	}
	return uc.Name, true
}

// add records c and returns how many connections its host has. The
// caller holds w.mu.
func (w *connWatch) add(c Conn) int {
	conns := w.byHost[c.host]
	if conns == nil {
		conns = make(map[connID]*Conn)
		w.byHost[c.host] = conns
	}
	id := c.id()
	if _, ok := w.gone[id]; ok {
		return len(conns)
	}
	seen, ok := w.seen[id]
	if !ok {
		seen = w.now()
		w.seen[id] = seen
	}
	c.seen = seen
	old := conns[id]
	switch {
	case !c.sampled && old != nil: // an event: connz knows more
		c.last, c.in, c.sampled, c.inSince = old.last, old.in, old.sampled, old.inSince
	case c.sampled && old != nil && old.sampled && old.in == c.in:
		c.inSince = old.inSince
	case c.sampled:
		c.inSince = w.now()
	}
	conns[id] = &c
	return len(conns)
}

// drop forgets a connection. The caller holds w.mu.
func (w *connWatch) drop(host string, id connID) {
	delete(w.seen, id)
	if conns := w.byHost[host]; conns != nil {
		delete(conns, id)
		if len(conns) == 0 {
			delete(w.byHost, host)
		}
	}
}

// closed forgets a connection that closed, and counts a strike against
// its host when it was a newer link that closed while an older one stays
// open and active (see the file comment). The caller holds w.mu.
func (w *connWatch) closed(host string, id connID) {
	conns := w.byHost[host]
	c := conns[id]
	w.drop(host, id)
	w.gone[id] = w.now()
	if c == nil || c.Start.IsZero() {
		return
	}
	now := w.now()
	silent := w.silentAfter(host)
	var older []Conn
	for _, o := range conns {
		if o.Start.Before(c.Start) && o.quiet(now) <= silent {
			older = append(older, *o)
		}
	}
	if len(older) == 0 || w.standing(host) {
		return
	}
	gone := *c
	gone.Closed = now
	strikes := append(recentStrikes(w.strikes[host], now), gone)
	if len(strikes) < churnStrikes {
		w.strikes[host] = strikes
		return
	}
	delete(w.strikes, host)
	w.churned[host] = append(older, strikes...)
	w.poke()
}

// recentStrikes returns the strikes that closed within churnWindow
// before now.
func recentStrikes(strikes []Conn, now time.Time) []Conn {
	return slices.DeleteFunc(slices.Clone(strikes), func(s Conn) bool { return now.Sub(s.Closed) > churnWindow })
}

// takeChurned returns the conflicts strikes made since the last call,
// and forgets strikes too old to count.
func (w *connWatch) takeChurned() map[string][]Conn {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := w.now()
	for h, s := range w.strikes {
		if s = recentStrikes(s, now); len(s) == 0 {
			delete(w.strikes, h)
		} else {
			w.strikes[h] = s
		}
	}
	out := w.churned
	if len(out) > 0 {
		w.churned = make(map[string][]Conn)
	}
	return out
}

func (w *connWatch) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run reconciles with connz at once and every connzEvery, and looks at
// hosts with two connections when woken and every connCheckEvery while
// any is left to look at, until ctx ends.
func (w *connWatch) run(ctx context.Context) {
	defer w.unsubscribe()
	full := time.NewTimer(0)
	defer full.Stop()
	check := time.NewTicker(connCheckEvery)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-full.C:
			w.refreshStaleBound(ctx)
			if err := w.reconcile(ctx, ""); err != nil && ctx.Err() == nil {
				w.log.Warn("cannot list the fleet's NATS connections; two connections on one host's identity are seen from the servers' events only until it works", "err", err)
			}
			full.Reset(jittered(connzEvery))
			w.checkAll(ctx)
		case <-w.wake:
			w.checkAll(ctx)
		case <-check.C:
			w.checkAll(ctx)
		}
	}
}

// checkAll tells found of the conflicts strikes made, and looks again
// at every host with two connections or more.
func (w *connWatch) checkAll(ctx context.Context) {
	for h, conns := range w.takeChurned() {
		slices.SortFunc(conns, func(a, b Conn) int { return a.Start.Compare(b.Start) })
		w.found(ctx, h, conns)
	}
	w.mu.Lock()
	var hosts []string
	for h, conns := range w.byHost {
		if len(conns) >= 2 && !w.standing(h) {
			hosts = append(hosts, h)
		}
	}
	w.mu.Unlock()
	// Many at once (a node died: its connections' disconnects never
	// come, and its agents reconnected elsewhere) cost one list of the
	// account rather than one of each key.
	many := len(hosts) > connCheckMany
	if many {
		if err := w.reconcile(ctx, ""); err != nil {
			w.log.Debug("connz failed", "err", err)
		}
	}
	for _, h := range hosts {
		if ctx.Err() != nil {
			return
		}
		w.check(ctx, h, !many)
	}
}

// check judges host's connections, on what connz says of its keys now
// when refresh is set.
func (w *connWatch) check(ctx context.Context, host string, refresh bool) {
	w.mu.Lock()
	users := map[string]bool{}
	for _, c := range w.byHost[host] {
		users[c.User] = true
	}
	w.mu.Unlock()
	for u := range users {
		if !refresh {
			break
		}
		if err := w.reconcile(ctx, u); err != nil {
			// The events' view is judged alone; last activity is then
			// unknown, which excuses nothing.
			w.log.Debug("connz of a key failed", "host", host, "err", err)
		}
	}
	w.mu.Lock()
	conns := make([]Conn, 0, len(w.byHost[host]))
	for _, c := range w.byHost[host] {
		conns = append(conns, *c)
	}
	stale := w.staleBound
	w.mu.Unlock()
	counted, _ := judge(conns, w.now(), connGrace, w.silentAfter(host), stale)
	if len(counted) >= 2 {
		slices.SortFunc(counted, func(a, b Conn) int { return a.Start.Compare(b.Start) })
		w.found(ctx, host, counted)
	}
}

// reconcile replaces what the watch knows of the connections of user
// (empty: of every agent) by what the servers report now.
func (w *connWatch) reconcile(ctx context.Context, user string) error {
	asked := w.now()
	conns, err := w.connz(ctx, user)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// Every connection the servers did not report is gone (a
	// disconnect event lost, a server that died), unless the watch saw
	// it first after asking: the answers may predate it.
	live := make(map[connID]bool, len(conns))
	for _, c := range conns {
		live[c.id()] = true
	}
	for host, hc := range w.byHost {
		for id, c := range hc {
			if (user == "" || c.User == user) && !live[id] && c.seen.Before(asked) {
				w.closed(host, id)
			}
		}
	}
	for id, at := range w.gone {
		if w.now().Sub(at) > goneFor {
			delete(w.gone, id)
		}
	}
	for _, c := range conns {
		w.add(c)
	}
	return nil
}

// connzReply is one server's answer to a connz request.
type connzReply struct {
	Server *server.ServerInfo `json:"server"`
	Data   *server.Connz      `json:"data"`
	Error  *server.ApiError   `json:"error"`
}

// connz asks every server for the fleet account's agent connections (of
// user only, when set), page by page.
func (w *connWatch) connz(ctx context.Context, user string) ([]Conn, error) {
	var out []Conn
	for offset := 0; ; offset += w.page {
		replies, err := w.connzRound(ctx, server.ConnzOptions{Username: true, User: user, Offset: offset, Limit: w.page})
		if err != nil {
			return nil, err
		}
		more := false
		for _, r := range replies {
			if r.Error != nil {
				return nil, fmt.Errorf("connz: a server answered %q", r.Error.Description)
			}
			if r.Data == nil {
				continue
			}
			more = more || r.Data.Total > offset+len(r.Data.Conns)
			out = append(out, w.agentConns(r.Data)...)
		}
		if !more {
			return out, nil
		}
	}
}

// agentConns returns the agent connections of one server's connz.
func (w *connWatch) agentConns(z *server.Connz) []Conn {
	var out []Conn
	for _, ci := range z.Conns {
		if ci == nil || ci.IssuerKey != w.signerPub || ci.Account != w.accountPub {
			continue
		}
		host, ok := w.host(ci.AuthorizedUser, ci.JWT)
		if !ok {
			continue
		}
		out = append(out, Conn{Server: z.ID, CID: ci.Cid, User: ci.AuthorizedUser, IP: ci.IP, Start: ci.Start, last: ci.LastActivity, host: host,
			in: ci.InMsgs, sampled: true})
	}
	return out
}

// connzRound sends one connz request to every server and decodes the
// answers.
func (w *connWatch) connzRound(ctx context.Context, opts server.ConnzOptions) ([]connzReply, error) {
	body, err := json.Marshal(server.ConnzEventOptions{ConnzOptions: opts})
	if err != nil {
		return nil, err
	}
	msgs, err := gather(ctx, w.nc, "$SYS.REQ.ACCOUNT.PING.CONNZ", body)
	if err != nil {
		return nil, fmt.Errorf("connz: %w", err)
	}
	out := make([]connzReply, len(msgs))
	for i, m := range msgs {
		if err := json.Unmarshal(m.Data, &out[i]); err != nil {
			return nil, fmt.Errorf("connz: unreadable answer %.200q: %w", m.Data, err)
		}
	}
	return out, nil
}

// gather sends a request every server answers, and collects the answers
// until none came for roundQuiet (or connzWait is over).
func gather(ctx context.Context, nc *nats.Conn, subject string, body []byte) ([]*nats.Msg, error) {
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, body); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(connzWait)
	var out []*nats.Msg
	wait := connzWait
	for {
		rctx, cancel := context.WithTimeout(ctx, min(wait, time.Until(deadline)))
		m, err := sub.NextMsgWithContext(rctx)
		cancel()
		if err != nil {
			if len(out) > 0 {
				return out, nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("no NATS server answered %s within %s", subject, connzWait)
		}
		out = append(out, m)
		wait = roundQuiet
	}
}

// ConflictDetail is the text a conflict shows in hosts.
func ConflictDetail(conns []Conn) string {
	parts := make([]string, len(conns))
	closed := 0
	for i := range conns {
		parts[i] = conns[i].String()
		if !conns[i].Closed.IsZero() {
			closed++
		}
	}
	what := fmt.Sprintf("%d live NATS connections use this host's identity", len(conns))
	if closed > 0 {
		what = fmt.Sprintf("a second client keeps connecting on this host's identity: %d newer NATS connections closed while an older one stayed open and active (a restart or a move ends the older one)", closed)
	}
	return fmt.Sprintf("%s (key %s): %s; its credential may have been copied. An operator must revoke it (fleetctl agent revoke) or re-enrol it with a --replace token",
		what, protocol.Clip(conns[0].User, 12), strings.Join(parts, "; "))
}

// WatchHooks are what the watch of agent connections needs of the
// gateway.
type WatchHooks struct {
	// HostOf returns the host a key is enrolled for.
	HostOf func(user string) (string, bool)
	// SilentAfter returns how long without activity makes host's older
	// connection a dead link.
	SilentAfter func(host string) time.Duration
	// Standing reports whether host's conflict was found already and
	// stands: it is not looked at again.
	Standing func(host string) bool
	// Found is told each conflict (every look while it lasts: it must
	// keep its own record of what it already knows).
	Found func(ctx context.Context, host string, conns []Conn)
}

// WatchConnections starts hearing the servers' connect and disconnect
// events of the fleet account (as the system user), nc being a fleet
// account user that asks connz, and returns the watch's loop, which
// judges the connections until its ctx ends: two live connections on one
// host's identity are told to h.Found.
func (a *Authority) WatchConnections(nc *nats.Conn, log *slog.Logger, h WatchHooks) (func(ctx context.Context), error) {
	w := newConnWatch(log, a.accountPub, a.AgentSignerPub(), a.sys, nc)
	w.hostOf, w.silentAfter, w.standing, w.found = h.HostOf, h.SilentAfter, h.Standing, h.Found
	if err := w.subscribe(); err != nil {
		return nil, err
	}
	return w.run, nil
}

// jittered returns d plus up to a tenth more.
func jittered(d time.Duration) time.Duration { return d + rand.N(d/10+1) }
