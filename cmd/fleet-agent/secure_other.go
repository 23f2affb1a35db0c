//go:build !linux

package main

// hideFromSameUser has nothing to do where /proc does not expose a
// process's environment to its user.
func hideFromSameUser() error { return nil }
