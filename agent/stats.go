package agent

import (
	"sync/atomic"

	"github.com/fleetmcp/fleetmcp/protocol"
)

// This file keeps the agent's own counters, which every announce carries
// (protocol.AgentStats): agents have no listening port, so the gateway
// exports them as metrics per host.

// callStats count calls since the process started.
type callStats struct {
	served, failed, refused atomic.Uint64
}

// stats returns the counters and the agent's state now.
func (a *Agent) stats() *protocol.AgentStats {
	failed := a.counts.failed.Load() // first: see run
	return &protocol.AgentStats{
		CallsServed:  a.counts.served.Load(),
		CallsFailed:  failed,
		CallsRefused: a.counts.refused.Load(),
		Queued:       len(a.queue),
		Tasks:        a.tasks.RunningCount(),
		RSSBytes:     selfRSS(),
	}
}
