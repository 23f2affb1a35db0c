// Package netutil holds the network helpers the gateway's packages
// share: listening with an error that says what to do. It knows no
// gateway concern and imports nothing from the module.
package netutil

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// Listen listens on addr (host:port) for what, and says plainly when
// another process (likely one of who) holds the address and which flag
// chooses another.
func Listen(addr, what, who, flag string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	switch {
	case err == nil:
		return ln, nil
	case errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("address %s for %s is already in use (%s?); stop that process or choose another address with %s: %w",
			addr, what, who, flag, err)
	default:
		return nil, fmt.Errorf("%s cannot listen on %s: %w; choose another address with %s", what, addr, err, flag)
	}
}
