package childproc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// attr makes a child process die with its parent, so that none is left
// behind when the command is killed.
func attr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }

// CPUSeconds returns the CPU time (user and system) p has used, from
// /proc/pid/stat; 0 when it cannot be read.
func (p *Proc) CPUSeconds() float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid()))
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
