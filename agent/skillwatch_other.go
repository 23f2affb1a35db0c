//go:build !linux

package agent

import (
	"context"
	"errors"
)

// watchNative is not available here: the catalog polls.
func (c *catalog) watchNative(context.Context, func()) error {
	return errors.New("change notification is not implemented on this system")
}
