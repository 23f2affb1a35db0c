package tasks

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
)

// procIdentity returns what tells process pid apart from a later process
// that reuses its PID: its start time in clock ticks since boot (field 22
// of /proc/PID/stat), and whether it has already exited (a zombie).
func procIdentity(pid int) (start string, exited bool, err error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false, err
	}
	return parseProcStat(data)
}

// parseProcStat reads the state and start time from the contents of
// /proc/PID/stat. The command name (field 2) is in parentheses and may
// itself hold spaces and parentheses, so fields are counted from the last
// ')'.
func parseProcStat(data []byte) (start string, exited bool, err error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return "", false, errors.New("no command name in /proc stat")
	}
	fields := strings.Fields(string(data[i+1:]))
	// fields[0] is field 3 (state); field 22 (starttime) is fields[19].
	if len(fields) < 20 {
		return "", false, errors.New("short /proc stat")
	}
	if _, err := strconv.ParseUint(fields[19], 10, 64); err != nil {
		return "", false, errors.New("bad start time in /proc stat")
	}
	state := fields[0]
	return fields[19], state == "Z" || state == "X", nil
}

var bootIDOnce = sync.OnceValue(func() string {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
})

// bootID identifies the current boot, so that a PID recorded before a
// reboot is never taken for a process of this one.
func bootID() string { return bootIDOnce() }
