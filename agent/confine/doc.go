// Package confine keeps the commands an agent runs away from the agent's
// own files: its state directory (identity, credentials, task records,
// trusted keys) and any other path it protects.
//
// The agent itself is never restricted: it must keep writing its state.
// Instead it starts every command through a small helper, its own
// executable run with Flag, which restricts itself and then replaces
// itself with the command (execve). The restriction is inherited by
// everything the command starts and cannot be lifted.
//
// On Linux the restriction is Landlock (ABI 1 and later). Landlock only
// allows: to deny one directory, the helper grants full access to every
// sibling of each path component on the way down to it, and only the
// right to list the components themselves (Plan). Names in a protected
// directory can therefore be listed, never opened, created, renamed or
// removed. On other systems, and on kernels without Landlock, nothing is
// confined (State says so).
//
// It imports nothing from the module: the agent and the commands' helper
// both use it.
package confine
