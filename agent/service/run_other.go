//go:build !windows

package service

import (
	"context"
	"time"
)

// RunIfService reports false: only Windows has a service control manager
// to run under. launchd and systemd start the agent as a plain process
// and stop it with SIGTERM, on which it drains.
func RunIfService(func(context.Context) error, func(), time.Duration) (bool, error) {
	return false, nil
}
