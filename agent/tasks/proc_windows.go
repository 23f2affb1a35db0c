package tasks

import (
	"strconv"

	"golang.org/x/sys/windows"

	"github.com/fleetmcp/fleetmcp/agent/winjob"
)

// procIdentity returns what tells process pid apart from a later process
// that reuses its PID: its creation time (100 ns units since 1601, which
// also tells boots apart), and whether it has exited.
func procIdentity(pid int) (start string, exited bool, err error) {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return "", false, err
	}
	defer windows.CloseHandle(h)
	var created, exit, kernel, user windows.Filetime
	if err := windows.GetProcessTimes(h, &created, &exit, &kernel, &user); err != nil {
		return "", false, err
	}
	var code uint32
	if err := windows.GetExitCodeProcess(h, &code); err != nil {
		return "", false, err
	}
	t := uint64(created.HighDateTime)<<32 | uint64(created.LowDateTime)
	return strconv.FormatUint(t, 10), code != winjob.StillActive, nil
}

// bootID is not needed on Windows: creation times differ across boots.
func bootID() string { return "" }
