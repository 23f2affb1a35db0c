// Package tasks runs the agent's background tasks: commands started by
// bash with background: true that outlive the call, and the agent too.
// Each task has a folder in the agent's state directory (what was asked,
// its status, its output, the exit status its wrapper records), written
// atomically; a Manager starts tasks up to a limit and queues the rest,
// supervises each (deadline, output cap, cancellation) in its own process
// group (a Job Object on Windows), records how it ended, applies
// retention, and re-attaches to the tasks a previous agent left running.
// The task tools read tasks only through its methods.
//
// It exists so that the life of a task, which spans agent restarts, has
// one owner with one API. It knows nothing of the tools, the host policy
// or the gateway: the agent gives it the shell invocation to use.
package tasks
