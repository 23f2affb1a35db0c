// Package policy makes the host policy's decisions: which tools a host
// serves, which paths its file tools may open, which command lines its bash
// tool may run, and which skills it shows. The machine's owner writes the
// policy; the agent enforces it whatever the gateway or the caller asks.
//
// It exists so that these decisions are pure functions of the policy and
// their inputs, testable without a fleet: it never touches the network,
// never runs a program, and leaves every file-system look-up (the working
// directory, the home directory, resolving symbolic links) to its caller.
// It imports nothing from this module but protocol.
//
// Under command rules git gets rules of its own (GitRules): git runs
// programs its configuration names, so the agent runs it through a guard
// that checks, with these rules, the configuration and the arguments each
// git process would run with.
//
// It also holds the host selector syntax (ParseSelector: web-*, env=prod,
// region in (eu,us)...), the one way the gateway's access rules, its hosts
// filter and fan-out name a set of hosts.
//
// Command rules are a guardrail, not a sandbox: an allowed interpreter or
// build tool can run anything. The confinement that holds is the operating
// system user the agent runs as.
package policy
