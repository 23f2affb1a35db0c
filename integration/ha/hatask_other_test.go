//go:build !unix

package ha

import "testing"

// failoverTask: background tasks on real agents are tested on Unix only.
func failoverTask(*testing.T, *gwCluster) (end, check func()) { return func() {}, func() {} }
