package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// pinElsewhere keeps every thread of this process off cpu: the threads
// made later, and the processes started later, inherit it.
func pinElsewhere(cpu int) error {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return err
	}
	set.Clear(cpu)
	if set.Count() == 0 {
		return fmt.Errorf("-flooder_cpu %d: no other CPU is left for the rest", cpu)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil {
			return fmt.Errorf("keep thread %d off CPU %d: %w", tid, cpu, err)
		}
	}
	return nil
}

// pinned returns the command that runs name with args on cpu alone.
func pinned(cpu int, name string, args ...string) (string, []string) {
	return "taskset", append([]string{"-c", strconv.Itoa(cpu), name}, args...)
}

const canPin = true
