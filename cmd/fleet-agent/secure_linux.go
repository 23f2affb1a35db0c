package main

import "golang.org/x/sys/unix"

// hideFromSameUser marks the process non-dumpable: its /proc files
// (environ, mem, fd) become readable by root only and other processes of
// the same user cannot ptrace it. Commands the agent runs as its own user
// therefore cannot read its key's seed out of /proc/<pid>/mem, nor a join
// token given in FLEET_JOIN_TOKEN out of /proc/<pid>/environ, where
// unsetting the variable does not reach.
func hideFromSameUser() error {
	return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}
