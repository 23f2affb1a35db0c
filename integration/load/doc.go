// Package load holds the measurements of the integration suite: a
// gateway process's memory through large transfers, an idle agent's
// memory, a host flooding the bus, and the per-call benchmarks against
// bare go-sdk servers. It has only tests; the harness is package
// integration.
package load
