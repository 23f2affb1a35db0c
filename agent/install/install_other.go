//go:build !linux && !darwin && !windows

package install

import (
	"context"
	"fmt"
	"runtime"
)

func install(context.Context, *Options) error {
	return fmt.Errorf("fleet-agent install does not support %s: run fleet-agent join under the system's service manager", runtime.GOOS)
}
