// Package netns tests hosts on machines of their own: fleet-agent
// processes in network namespaces joined to the test's side by veth
// links (root and ip netns, skipped elsewhere), the join pitfalls there,
// and deploy/README.md's walk-through run as pasted. It has only tests;
// the harness is package integration.
package netns
