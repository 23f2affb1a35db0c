package policy

import (
	"strings"
)

// launcher returns what programs that set up a process and then run a
// command (flock, chrt, taskset, unshare, setpriv, nsenter, chroot,
// script, systemd-run) run. Where their options are too irregular to
// find the command, it is unknown.
func (c *checker) launcher(name string, args []shWord) ([]runs, error) {
	switch name {
	case "flock":
		return c.flock(args)
	case "chrt", "taskset":
		return c.scheduler(name, args)
	case "unshare", "nsenter", "chroot":
		return c.namespaces(name, args)
	case "setpriv":
		p, err := c.parseOpts(name, args, optSpec{flags: "dhV",
			long: []string{"dump", "no-new-privs", "clear-groups", "keep-groups", "init-groups", "reset-env", "help", "version"},
			longVal: []string{"inh-caps", "ambient-caps", "bounding-set", "ruid", "euid", "rgid", "egid", "reuid", "regid",
				"groups", "securebits", "pdeathsig", "selinux-label", "apparmor-profile", "landlock-access", "landlock-rule",
				"seccomp-filter"}})
		return runsCommand(p.rest), err
	case "script":
		return c.scriptCmd(args)
	case "systemd-run":
		return c.systemdRun(args)
	}
	return nil, nil
}

// flock FILE CMD..., flock FILE -c SCRIPT, or flock FD (which runs
// nothing).
func (c *checker) flock(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("flock", args, optSpec{flags: "sxenouFhV", valued: "wE",
		long:    []string{"shared", "exclusive", "unlock", "nonblock", "nb", "close", "no-fork", "verbose", "help", "version"},
		longVal: []string{"timeout", "wait", "conflict-exit-code"}})
	if err != nil || len(p.rest) < 2 {
		return nil, err
	}
	cmd := p.rest[1:]
	switch {
	case cmd[0].text == "-c" || cmd[0].text == "--command":
		if len(cmd) < 2 {
			return nil, nil
		}
		return []runs{scriptWord(cmd[1], langSh)}, nil // $SHELL or /bin/sh -c
	case !cmd[0].literal() && len(cmd) > 1:
		// It may be -c: then the next word is a script.
		return []runs{{words: cmd}, scriptWord(cmd[1], langSh)}, nil
	}
	return runsCommand(cmd), nil
}

// scheduler handles chrt [opts] [PRIORITY] CMD... and taskset [opts] MASK
// CMD...; with -p they change a running process instead.
func (c *checker) scheduler(name string, args []shWord) ([]runs, error) {
	spec := optSpec{flags: "acphV", long: []string{"all-tasks", "cpu-list", "pid", "help", "version"}}
	if name == "chrt" {
		spec = optSpec{flags: "abdefimoprRvhV", valued: "TPD",
			long: []string{"all-tasks", "batch", "deadline", "ext", "fifo", "idle", "other", "rr", "reset-on-fork",
				"max", "pid", "verbose", "help", "version"},
			longVal: []string{"sched-runtime", "sched-period", "sched-deadline"}}
	}
	p, err := c.parseOpts(name, args, spec)
	switch {
	case err != nil:
		return nil, err
	case p.has("p", "pid") || p.has("m", "max") || len(p.rest) == 0:
		return nil, nil
	case name == "taskset":
		return runsCommand(p.rest[1:]), nil
	case isNumber(p.rest[0]):
		return runsCommand(p.rest[1:]), nil
	}
	// Newer chrt takes no priority for SCHED_OTHER and the like.
	return runsCommand(p.rest), nil
}

func isNumber(w shWord) bool {
	return w.text != "" && strings.Trim(w.text, "0123456789") == ""
}

// namespaces handles unshare, nsenter and chroot: the command runs in
// other namespaces, perhaps under another root directory or in another
// working directory; without one they start a shell.
func (c *checker) namespaces(name string, args []shWord) ([]runs, error) {
	var spec optSpec
	switch name {
	case "unshare":
		spec = optSpec{flags: "frchV", valued: "RwSGl", attached: "imnpuUCT",
			long: []string{"ipc", "mount", "net", "pid", "uts", "user", "cgroup", "time", "fork", "keep-caps", "kill-child",
				"mount-proc", "mount-binfmt", "map-root-user", "map-current-user", "map-auto", "help", "version"},
			longVal: []string{"map-user", "map-users", "map-group", "map-groups", "propagation", "setgroups", "root", "wd",
				"setuid", "setgid", "monotonic", "boottime", "load-interp"}}
	case "nsenter":
		spec = optSpec{flags: "aFZcehV", valued: "tSGWN", attached: "muinpCUTrw",
			long: []string{"ipc", "mount", "net", "pid", "uts", "user", "cgroup", "time", "root", "wd", "all",
				"preserve-credentials", "no-fork", "follow-context", "join-cgroup", "env", "user-parent", "keep-caps", "help", "version"},
			longVal: []string{"target", "setuid", "setgid", "wdns", "net-socket"}}
	case "chroot":
		spec = optSpec{long: []string{"skip-chdir", "help", "version"}, longVal: []string{"userspec", "groups"}}
	}
	p, err := c.parseOpts(name, args, spec)
	if err != nil {
		return nil, err
	}
	cmd, elsewhere := p.rest, p.has("R", "root")
	switch name {
	case "nsenter":
		elsewhere = p.has("m", "mount") || p.has("a", "all") || p.has("r", "root")
	case "chroot":
		if len(cmd) == 0 {
			return nil, nil
		}
		cmd, elsewhere = cmd[1:], true
	}
	if elsewhere || p.has("w", "wd") || p.has("W", "wdns") {
		c.line.cd = true
	}
	if len(cmd) == 0 {
		return []runs{{unknown: "starts a shell that reads its commands from standard input"}}, nil
	}
	return []runs{{words: cmd, elsewhere: elsewhere}}, nil
}

// scriptCmd handles script [opts] [FILE]: -c runs a command with $SHELL,
// otherwise an interactive shell reads standard input. Options may follow
// the file name.
func (c *checker) scriptCmd(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("script", args, optSpec{flags: "aefqhV", valued: "BcEIOomT", attached: "t", permute: true,
		long: []string{"append", "return", "flush", "force", "quiet", "help", "version", "timing"},
		longVal: []string{"log-io", "command", "echo", "log-in", "log-out", "output-limit", "logging-format",
			"log-timing"}})
	if err != nil {
		return nil, err
	}
	var rs []runs
	for _, v := range p.vals {
		if v.name == "c" || v.name == "command" {
			rs = append(rs, scriptWord(v.val, langSh))
		}
	}
	if len(rs) == 0 {
		return []runs{{unknown: "starts a shell that reads its commands from standard input"}}, nil
	}
	return rs, nil
}

// systemdRun handles systemd-run [opts] CMD...: the command runs as a
// transient unit, in / unless --same-dir or --scope. Properties that run
// commands (Exec*) or set their environment make it unknown, and so do
// $ and % in its name, which systemd expands.
func (c *checker) systemdRun(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("systemd-run", args, optSpec{flags: "hrdtPqGSv", valued: "HMCupE",
		long: []string{"help", "version", "no-ask-password", "user", "system", "scope", "slice-inherit", "remain-after-exit",
			"send-sighup", "same-dir", "pty", "pipe", "quiet", "collect", "shell", "no-block", "wait", "on-clock-change",
			"on-timezone-change", "verbose", "ignore-failure"},
		longVal: []string{"host", "machine", "capsule", "unit", "property", "description", "slice", "expand-environment",
			"service-type", "uid", "gid", "nice", "working-directory", "setenv", "json", "on-active", "on-boot", "on-startup",
			"on-unit-active", "on-unit-inactive", "on-calendar", "path-property", "socket-property", "timer-property", "background"}})
	if err != nil {
		return nil, err
	}
	if p.has("S", "shell") {
		return []runs{{unknown: "starts a shell that reads its commands from standard input"}}, nil
	}
	for _, v := range p.vals {
		switch v.name {
		case "p", "property", "path-property", "socket-property", "timer-property":
			if prop := strings.ToLower(v.val.text); !v.val.literal() || strings.HasPrefix(prop, "exec") || strings.HasPrefix(prop, "environment") {
				return []runs{{unknown: "sets a unit property (" + shown(v.val.src) + ") that may run commands or set their environment"}}, nil
			}
		case "E", "setenv":
			if _, err := c.skipAssignments("systemd-run --setenv", []shWord{v.val}); err != nil {
				return nil, err
			}
		}
	}
	if !p.has("", "scope") && !p.has("d", "same-dir") || p.has("", "working-directory") {
		c.line.cd = true
	}
	if len(p.rest) == 0 {
		return nil, nil
	}
	cmd := append([]shWord(nil), p.rest...)
	for i, w := range cmd {
		if strings.Contains(w.text, "$") || i == 0 && strings.Contains(w.text, "%") {
			cmd[i] = dynWord(w.src) // expanded by systemd
		}
	}
	return []runs{{words: cmd, elsewhere: p.has("H", "host") || p.has("M", "machine") || p.has("C", "capsule")}}, nil
}
