package agent

import (
	"context"
	"net"
	"sync"
)

// dialer dials NATS servers for one connection of the agent. Until the
// connection is established (connected) it gives up as soon as its ctx
// ends: a dial in progress is abandoned and a connection still in its
// handshake is closed, so that an agent told to stop never waits for a
// server that does not answer (nats.Connect itself takes no context).
// Once connected, the connections it makes for nats.go's own reconnects
// are left alone: the session ends by closing the nats.Conn.
type dialer struct {
	ctx context.Context
	net net.Dialer
	// failed, when set, hears of every dial that failed.
	failed func(addr string, err error)

	mu    sync.Mutex
	done  bool
	stops []func() bool // stop watching ctx for connections in their handshake
}

// Dial implements nats.CustomDialer.
func (d *dialer) Dial(network, address string) (net.Conn, error) {
	d.mu.Lock()
	done := d.done
	d.mu.Unlock()
	if done {
		conn, err := d.net.Dial(network, address)
		if err != nil && d.failed != nil {
			d.failed(address, err)
		}
		return conn, err
	}
	conn, err := d.net.DialContext(d.ctx, network, address)
	if err != nil {
		if d.failed != nil && d.ctx.Err() == nil {
			d.failed(address, err)
		}
		return nil, err
	}
	stop := context.AfterFunc(d.ctx, func() { conn.Close() })
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.done {
		stop()
	} else {
		d.stops = append(d.stops, stop)
	}
	return conn, nil
}

// connected ends the watch of ctx: for the connections made so far, and
// for those made later.
func (d *dialer) connected() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.done = true
	for _, stop := range d.stops {
		stop()
	}
	d.stops = nil
}
