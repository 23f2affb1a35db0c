// Package ha tests high availability end to end: gateways whose embedded
// NATS servers are one cluster, an external cluster, failover checked by
// integration/hacheck, a partition in a network namespace, and replicas
// behind the deploy/proxy examples. It has only tests; the harness is
// package integration.
package ha
