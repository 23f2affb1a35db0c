package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// childAttr makes a child process die with the command, so that none is
// left behind when it is killed.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }

// cpuSeconds returns the CPU time (user and system) process pid has
// used, from /proc/pid/stat; 0 when it cannot be read.
func cpuSeconds(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name, in parentheses, may hold spaces: the fields
	// counted start after its closing parenthesis.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ is 100 on Linux
}

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
