package confine

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
)

// ABI returns the Landlock ABI version the kernel offers, and why it
// offers none (0).
func ABI() (int, string) {
	v, err := ll.LandlockGetABIVersion()
	switch {
	case err == nil && v > 0:
		return v, ""
	case errors.Is(err, syscall.ENOSYS):
		return 0, "kernel has no Landlock (Linux 5.13 or later with CONFIG_SECURITY_LANDLOCK)"
	case errors.Is(err, syscall.EOPNOTSUPP):
		return 0, "Landlock is off in this kernel (add landlock to the lsm= boot parameter)"
	case err != nil:
		return 0, fmt.Sprintf("kernel Landlock check failed: %v", err)
	}
	return 0, "kernel has no Landlock"
}

// fileRights are the rights the kernel takes on a file (not a directory).
const fileRights = ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSTruncate | ll.AccessFSIoctlDev

// handled returns the filesystem rights restricted under ABI abi: all
// but connecting to UNIX sockets by path, which holds no file's content.
func handled(abi int) landlock.AccessFSSet {
	set := landlock.AccessFSSet(ll.AccessFSExecute | ll.AccessFSWriteFile | ll.AccessFSReadFile | ll.AccessFSReadDir |
		ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSMakeChar | ll.AccessFSMakeDir | ll.AccessFSMakeReg |
		ll.AccessFSMakeSock | ll.AccessFSMakeFifo | ll.AccessFSMakeBlock | ll.AccessFSMakeSym)
	if abi >= 2 {
		set |= ll.AccessFSRefer
	}
	if abi >= 3 {
		set |= ll.AccessFSTruncate
	}
	if abi >= 5 {
		set |= ll.AccessFSIoctlDev
	}
	return set
}

// rights returns the kernel rights of r under the handled set h.
func rights(r Rule, h landlock.AccessFSSet) landlock.AccessFSSet {
	var a landlock.AccessFSSet
	switch r.Access {
	case List:
		a = ll.AccessFSReadDir
	case ReadFile:
		a = ll.AccessFSReadFile
	case ReadExec:
		a = ll.AccessFSReadFile | ll.AccessFSExecute | ll.AccessFSReadDir
	case Full:
		a = h
	}
	if !r.Dir {
		a &= fileRights
	}
	return a & h
}

// restrict confines this process (all its threads) to rules, with the
// rights of Landlock ABI abi. It sets no_new_privs.
func restrict(rules []Rule, abi int) error {
	if have, why := ABI(); have < abi {
		if why == "" {
			why = fmt.Sprintf("kernel offers Landlock ABI %d", have)
		}
		return fmt.Errorf("the agent found Landlock ABI %d, now %s", abi, why)
	}
	h := handled(abi)
	lr := make([]landlock.Rule, 0, len(rules))
	for _, r := range rules {
		// A rule grants; one the kernel cannot take (an entry gone or
		// out of the user's reach since it was listed, another user's
		// FUSE mount) is left out rather than failing the command.
		if !reachable(r.Path) {
			continue
		}
		if a := rights(r, h); a != 0 {
			lr = append(lr, landlock.PathAccess(a, r.Path).IgnoreIfMissing())
		}
	}
	return landlock.Config{HandledAccessFS: h}.RestrictPaths(lr...)
}

// reachable reports whether path can be opened as Landlock opens it.
func reachable(path string) bool {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	unix.Close(fd)
	return true
}

// execve replaces the process with argv[0], looked up in PATH when it
// has no slash.
func execve(argv, env []string) error {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return err
	}
	return syscall.Exec(path, argv, env)
}
