package policy

import (
	"strings"
)

// ssh runs local programs by its options and configuration: a
// ProxyCommand, a LocalCommand, a KnownHostsCommand, "Match exec", a
// second ssh for a jump host (ProxyJump, -J), the xauth of
// XAuthLocation, PKCS#11 and security key libraries, whatever a
// configuration file named by -F or Include says. Those are refused
// wherever ssh runs: typed on the line, or as the remote shell of scp,
// sftp, rsync (-e, --rsh), cpio, tar, mosh, sshfs, unison and borg,
// with or without a host. ssh pastes the host and user names into the
// commands its configuration names (%h, %u) and runs them through a
// shell, so a name holding shell syntax is refused too. The ssh
// configuration files themselves (~/.ssh/config, /etc/ssh/ssh_config)
// are not read: keep ~/.ssh out of paths.write, as the shipped profiles
// do.

// sshSpec returns ssh's options.
func sshSpec() optSpec {
	return optSpec{flags: "46AaCfGgKkMNnqsTtVvXxYy", valued: "BbcDEeFIiJLlmOoPpQRSWw"}
}

// sshRuns returns what ssh and the programs that wrap it run: autossh
// takes ssh's options after its own, sshpass runs a command (ssh, as a
// rule) after its own, ssh-copy-id takes ssh options and runs a fixed
// remote script.
func (c *checker) sshRuns(name string, args []shWord) ([]runs, error) {
	switch name {
	case "autossh":
		// Its own options come first (-M PORT, -f, -V); ssh's follow.
		for len(args) > 0 {
			switch t := args[0].text; {
			case t == "-M" && len(args) > 1:
				args = args[2:]
			case strings.HasPrefix(t, "-M") || t == "-f" || t == "-V":
				args = args[1:]
			default:
				return c.ssh(args)
			}
		}
		return nil, nil
	case "sshpass":
		p, err := c.parseOpts(name, args, optSpec{flags: "evh", valued: "fdpP"})
		if err != nil {
			return nil, err
		}
		return runsInheriting(p.rest), nil
	case "ssh-copy-id":
		p, err := c.parseOpts(name, args, optSpec{flags: "fnsxh", valued: "tFopJ", attached: "i", permute: true})
		if err != nil {
			return nil, err
		}
		if rs := c.sshOptions(p.vals); rs != nil {
			return rs, nil
		}
		for _, w := range p.rest {
			if err := c.sshDestination(name, w); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	return c.ssh(args)
}

// ssh handles ssh [opts] HOST [opts] [CMD...]: the remote shell runs CMD,
// joined by spaces, as a command line, on a host that may be this one.
// Options can make ssh run local commands (ProxyCommand, LocalCommand, a
// configuration file naming them); then what it runs is unknown, with a
// host or without one (rsync -e 'ssh -o ProxyCommand=...' appends the
// host itself).
func (c *checker) ssh(args []shWord) ([]runs, error) {
	p, err := c.parseOpts("ssh", args, sshSpec())
	if err != nil {
		return nil, err
	}
	var after parsedOpts
	if len(p.rest) > 0 {
		// ssh reads options after the host too.
		if after, err = c.parseOpts("ssh", p.rest[1:], sshSpec()); err != nil {
			return nil, err
		}
	}
	vals := append(p.vals, after.vals...)
	if rs := c.sshOptions(vals); rs != nil {
		return rs, nil
	}
	if err := c.sshWrites(vals); err != nil {
		return nil, err
	}
	if len(p.rest) == 0 {
		return nil, nil // no host: ssh runs nothing, or is given one by the program that runs it
	}
	host := p.rest[0]
	if !host.literal() {
		return []runs{{unknown: "connects to a host (or takes an option) only known when the line runs"}}, nil
	}
	if err := c.sshDestination("ssh", host); err != nil {
		return nil, err
	}
	c.line.cd = true
	switch {
	case strings.ContainsAny(p.short+after.short, "NsW"):
		return nil, nil // forwards ports or a subsystem: runs no command
	case len(after.rest) == 0 && c.stdin.known:
		r := c.stdinScript(langSh, "")
		r.elsewhere = true
		return []runs{r}, nil // a here-document for the remote shell
	case len(after.rest) == 0:
		return []runs{{unknown: "starts a remote shell that reads its commands from standard input"}}, nil
	}
	r := c.joined(after.rest, langSh)
	r.elsewhere = true
	return []runs{r}, nil
}

// sshOptions returns what ssh's options vals run locally, or nil; a user
// name given with -l is checked as a host name is.
func (c *checker) sshOptions(vals []optVal) []runs {
	for _, o := range vals {
		if why := sshOptionRuns(o); why != "" {
			return []runs{{unknown: why}}
		}
		if o.name == "l" && !sshName(o.val) {
			return []runs{{unknown: "logs in as user " + shown(o.val.src) + ", a name holding shell syntax, which ssh pastes into the commands its configuration runs (%u)"}}
		}
	}
	return nil
}

// sshWrites checks the files ssh's options name for it to write: its
// log (-E) and its known hosts file.
func (c *checker) sshWrites(vals []optVal) error {
	for _, o := range vals {
		switch {
		case o.name == "E":
			if err := c.writesNamed("ssh -E", o.val); err != nil {
				return err
			}
		case o.name == "o":
			key, value := sshConfigOption(o.val.text)
			if key == "userknownhostsfile" {
				for _, f := range strings.Fields(value) {
					if err := c.writesNamed("ssh -o UserKnownHostsFile", shWord{text: f, src: o.val.src}); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// sshConfigOption splits the value of ssh -o into its key, in lower case,
// and its value: "Key=Value", "Key Value" or "Key = Value".
func sshConfigOption(s string) (key, value string) {
	s = strings.TrimLeft(s, " \t")
	i := strings.IndexAny(s, "= \t")
	if i < 0 {
		return strings.ToLower(s), ""
	}
	key, value = strings.ToLower(s[:i]), strings.TrimLeft(s[i:], " \t")
	value = strings.TrimLeft(strings.TrimPrefix(value, "="), " \t")
	return key, value
}

// sshOptionRuns says why ssh option o may run a local command, or "".
func sshOptionRuns(o optVal) string {
	switch o.name {
	case "F":
		if o.val.text == "none" {
			return "" // no configuration file at all
		}
		return "reads a configuration file, which can name local commands to run (ProxyCommand, LocalCommand)"
	case "I":
		return "loads a PKCS#11 shared library (-I)"
	case "J":
		return "reaches the host through a jump host (-J), which it connects to by running ssh again through the shell"
	case "o":
		key, _ := sshConfigOption(o.val.text)
		switch {
		case !o.val.literal():
			return "takes an option only known when the line runs"
		case strings.Contains(key, "command"), key == "match", key == "include", key == "xauthlocation":
			return "takes option " + shown(o.val.src) + ", which can run local commands"
		case key == "proxyjump":
			return "takes option " + shown(o.val.src) + ", which runs ssh again through the shell for the jump host"
		case key == "pkcs11provider", key == "securitykeyprovider":
			return "takes option " + shown(o.val.src) + ", which loads a shared library"
		}
	}
	return ""
}

// sshDestination refuses a destination ([user@]host, ssh://...) holding
// shell syntax: ssh pastes the host and user into the commands its
// configuration names (ProxyCommand nc %h %p) and runs them through a
// shell.
func (c *checker) sshDestination(cmd string, w shWord) error {
	if !w.literal() || sshName(w) {
		return nil
	}
	return c.refuse("%s %s: the host or user name holds shell syntax, which ssh pastes into the commands its configuration runs through a shell (%%h, %%u)", cmd, shown(w.src))
}

// sshName reports whether w, a host or user name (or a destination such
// as user@host or ssh://user@host:22), holds no shell syntax and does not
// start like an option.
func sshName(w shWord) bool {
	t := w.text
	return !strings.HasPrefix(t, "-") && !strings.ContainsFunc(t, func(r rune) bool {
		return r <= ' ' || r == 0x7f || strings.ContainsRune("'\"`\\$;&|<>(){}*?!#~^", r)
	})
}

// remoteHost returns the host part of an scp, sftp or rsync operand,
// "[user@]host:path" (also "host::module" for rsync), and whether it
// names one: a colon before any slash.
func remoteHost(t string) (string, bool) {
	if rest, ok := strings.CutPrefix(t, "scp://"); ok {
		host, _, _ := strings.Cut(rest, "/")
		return host, true
	}
	if rest, ok := strings.CutPrefix(t, "rsync://"); ok {
		host, _, _ := strings.Cut(rest, "/")
		return host, true
	}
	i := strings.IndexByte(t, ':')
	if i <= 0 || strings.Contains(t[:i], "/") {
		return "", false
	}
	return t[:i], true
}

// remoteOperands checks the hosts the operands of scp, sftp or rsync
// name, as ssh's destinations are checked.
func (c *checker) remoteOperands(cmd string, rest []shWord) error {
	for _, w := range rest {
		if host, ok := remoteHost(w.text); ok {
			if err := c.sshDestination(cmd, shWord{text: host, src: w.src}); err != nil {
				return err
			}
		}
	}
	return nil
}

// scpProgram: scp and sftp run ssh (or -S PROGRAM) with ssh options, and
// sftp -D runs a local sftp server command. sftp also runs local shell
// commands ("!cmd") from its batch file or its standard input.
func scpProgram(name string) *optProgram {
	spec := lenient("346ABCOpqRrsTv", "cDEFiJlPoSX", nil, nil)
	if name == "sftp" {
		spec = lenient("46AaCfNpqrv", "BbcDFiJlPoRSsX", nil, nil)
	}
	prog := &optProgram{
		spec: spec,
		runs: []optRun{
			{names: []string{"S"}, kind: runProgram, args: [][]string{{string(dyn)}}},
			{names: []string{"D"}, kind: runShell},
		},
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			var rs []runs
			if rs := c.sshOptions(p.vals); rs != nil {
				return rs, nil
			}
			if err := c.remoteOperands(name, p.rest); err != nil {
				return nil, err
			}
			if name == "sftp" {
				for _, w := range p.rest {
					if err := c.sshDestination(name, w); err != nil {
						return nil, err
					}
				}
				rs = append(rs, runs{unknown: "runs local shell commands (!) from its batch file or standard input", allowOnly: true})
			}
			return rs, nil
		},
	}
	return prog
}

func rsyncProgram() *optProgram {
	return &optProgram{
		spec: lenient("vqcarRbudlLkKHpEAXogDtOJSnWxyCzPhi8460sFmIUN", "efTBM",
			names(`verbose quiet no-motd checksum archive recursive relative no-implied-dirs backup update
				inplace append append-verify dirs mkpath links copy-links copy-unsafe-links safe-links
				munge-links copy-dirlinks keep-dirlinks hard-links perms executability acls xattrs owner
				group devices specials times atimes open-noatime crtimes omit-dir-times omit-link-times
				super fake-super sparse preallocate dry-run whole-file one-file-system existing
				ignore-existing remove-source-files delete delete-before delete-during delete-delay
				delete-after delete-excluded ignore-missing-args delete-missing-args ignore-errors force
				partial delay-updates prune-empty-dirs numeric-ids ignore-times size-only compress
				cvs-exclude from0 old-args secluded-args trust-sender copy-devices write-devices blocking-io
				stats 8-bit-output human-readable progress itemize-changes list-only ipv4 ipv6 version
				help daemon no-detach fsync protect-args`),
			names(`rsh rsync-path info debug stderr backup-dir suffix chmod copy-as block-size max-delete
				max-size min-size max-alloc partial-dir usermap groupmap chown timeout contimeout
				modify-window temp-dir compare-dest copy-dest link-dest compress-choice zc compress-level zl
				skip-compress filter exclude exclude-from include include-from files-from address port
				sockopts out-format log-file log-file-format password-file early-input bwlimit stop-after
				stop-at write-batch only-write-batch read-batch protocol iconv checksum-choice cc
				checksum-seed outbuf remote-option config dparam`)),
		runs: []optRun{
			{names: []string{"e", "rsh"}, kind: runShell},
			{names: []string{"rsync-path"}, kind: runRemote},
			{names: []string{"M", "remote-option"}, kind: runHidden, why: "passes options to the remote rsync"},
			{names: []string{"config", "dparam"}, kind: runHidden, why: "configures an rsync daemon, which can run commands before and after transfers"},
		},
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			return nil, c.remoteOperands("rsync", p.rest)
		},
	}
}

// cpioProgram: cpio --rsh-command=CMD runs CMD for an archive on another
// host (-F host:file).
func cpioProgram() *optProgram {
	return &optProgram{
		spec: lenient("0aABcdfiIlLmoOprsStuvVF", "CEFHIMORW", nil, names(`rsh-command file format block-size message owner pattern-file io-size`)),
		runs: []optRun{{names: []string{"rsh-command"}, kind: runProgram, args: [][]string{{string(dyn)}}}},
	}
}

// moshProgram: mosh --ssh=CMD runs CMD through the shell to reach the
// host, and --server names the program run there.
func moshProgram() *optProgram {
	return &optProgram{
		spec: lenient("46anp", "p", nil, names(`ssh server client port family predict bind-server experimental-remote-ip`)),
		runs: []optRun{
			{names: []string{"ssh"}, kind: runShell},
			{names: []string{"client"}, kind: runProgram, args: [][]string{{string(dyn)}}},
			{names: []string{"server"}, kind: runRemote},
		},
	}
}

// sshfsProgram: sshfs -o ssh_command=CMD (or -o ssh_command CMD) runs CMD,
// -o directport and -o passive connect otherwise, and ssh's own -o options
// (ProxyCommand) pass through; -F names a configuration file.
func sshfsProgram() *optProgram {
	return &optProgram{
		spec: lenient("VfsdCh", "opF", nil, nil),
		runs: []optRun{{names: []string{"F"}, kind: runNever, why: "reads an ssh configuration file, which can name local commands to run"}},
		extra: func(c *checker, p parsedOpts) ([]runs, error) {
			for _, v := range p.vals {
				if v.name != "o" {
					continue
				}
				for _, opt := range strings.Split(v.val.text, ",") {
					key, _ := sshConfigOption(opt)
					switch {
					case !v.val.literal():
						return []runs{{unknown: "takes options only known when the line runs"}}, nil
					case strings.HasPrefix(key, "ssh_command"), key == "ssh_protocol", key == "sftp_server", key == "directport", key == "passive",
						sshOptionRuns(optVal{name: "o", val: shWord{text: opt, src: v.val.src}}) != "":
						return []runs{{unknown: "takes option " + shown(opt) + ", which names a program to run or connects otherwise"}}, nil
					}
				}
			}
			return nil, nil
		},
	}
}

// unisonProgram: unison -sshcmd CMD and -rshcmd run CMD; -servercmd
// names the program run on the other host.
func unisonProgram() *optProgram {
	return &optProgram{
		prepare: singleDashLong,
		spec:    lenient("", "", nil, names(`sshcmd rshcmd sshargs rshargs servercmd addversionno`)),
		runs: []optRun{
			{names: []string{"sshcmd", "rshcmd"}, kind: runProgram, args: [][]string{{string(dyn)}}},
			{names: []string{"sshargs", "rshargs"}, kind: runNever, why: "passes options to ssh, which can name local commands to run"},
			{names: []string{"servercmd"}, kind: runRemote},
		},
	}
}

// borgProgram: borg --rsh CMD runs CMD through the shell; --remote-path
// names the program run on the other host.
func borgProgram() *optProgram {
	return &optProgram{
		spec: lenient("vpn", "", nil, names(`rsh remote-path lock-wait`)),
		runs: []optRun{
			{names: []string{"rsh"}, kind: runShell},
			{names: []string{"remote-path"}, kind: runRemote},
		},
	}
}

// singleDashLong rewrites the options of a program that spells its long
// options with one dash (-sshcmd) with two, for the table to read.
func singleDashLong(_ *checker, args []shWord) ([]shWord, error) {
	out := make([]shWord, len(args))
	for i, w := range args {
		out[i] = w
		if len(w.text) > 2 && w.text[0] == '-' && w.text[1] != '-' {
			out[i].text = "-" + w.text
		}
	}
	return out, nil
}
