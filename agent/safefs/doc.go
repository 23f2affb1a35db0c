// Package safefs is the agent's link-refusing file layer. A path the host
// policy allowed is reached one directory at a time from its root, each
// opened relative to the last without following links (openat with
// O_NOFOLLOW on Unix, NtCreateFile relative to a handle on Windows, where
// junctions and other reparse points count as links), so a link swapped
// in after the check cannot redirect a read or a write. On top of that:
// files replaced atomically (a synced temporary file renamed over the
// old one, which keeps its mode, owner and access rules), renames and
// links that never replace anything, the resolution of paths as the
// tools and as a shell would open them, and Locks that serialise the
// mutations of a file within the process and against other processes.
//
// It exists so that the tools of the agent share one audited way to
// touch files. It must not import the agent, the gateway or any package
// beside it; from this module it uses only policy (for the rules of
// Windows names).
package safefs
