package main

import "os/exec"

// command makes the command that runs name with args, on cpu alone
// when cpu is not negative.
func command(cpu int, name string, args ...string) *exec.Cmd {
	if cpu >= 0 {
		name, args = pinned(cpu, name, args...)
	}
	return exec.Command(name, args...)
}
