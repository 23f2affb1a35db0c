package policy

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"unicode"

	"mvdan.cc/sh/v3/syntax"
)

// This file checks the files a command line's redirections open. The
// policy cannot look at the file system: it hands each target to the
// caller's FileCheck exactly as the shell will open it, and the caller
// resolves it the way the kernel will.

// FileCheck decides whether a command line may open the file at path for
// every one of ops. path is absolute and exactly what the shell opens:
// not cleaned, so that ".." keeps its meaning after a symbolic link
// (where the kernel takes the link's destination's parent, not the
// link's). A refusal is returned as the line's.
type FileCheck func(path string, ops ...Op) error

// lexicalFiles is the FileCheck of a caller without a file system: the
// path rules on the path with "." and ".." collapsed as text, which is
// right only where no symbolic link is involved.
func (p *Policy) lexicalFiles(path string, ops ...Op) error {
	for _, op := range ops {
		if err := p.checkOwnPath(op, path, path); err != nil {
			return err
		}
	}
	return nil
}

// hasPathRules reports whether path rules apply to any of ops.
func (p *Policy) hasPathRules(ops []Op) bool {
	return slices.ContainsFunc(ops, p.hasOwnPathRules)
}

// redirOps returns what a redirection with operator op does with the file
// its word names, or nil when the word names no file: here-documents and
// here-strings. <& and >& duplicate a descriptor when their word is a
// number (see isDescriptor), and otherwise may open a file.
func redirOps(op syntax.RedirOperator) []Op {
	switch op {
	case syntax.RdrOut, syntax.AppOut, syntax.RdrClob, syntax.AppClob, syntax.DplOut,
		syntax.RdrAll, syntax.RdrAllClob, syntax.AppAll, syntax.AppAllClob:
		return []Op{Write}
	case syntax.RdrIn, syntax.DplIn:
		return []Op{Read}
	case syntax.RdrInOut:
		return []Op{Read, Write}
	}
	return nil
}

// isDescriptor reports whether t, the word of <& or >&, duplicates or
// closes a descriptor (2, 3-, -) rather than naming a file.
func isDescriptor(t string) bool {
	n := strings.TrimSuffix(t, "-")
	return n == "" && t == "-" || n != "" && strings.Trim(n, "0123456789") == ""
}

// redirWhat names a redirection doing ops, for messages.
func redirWhat(ops []Op) string {
	switch {
	case len(ops) > 1:
		return "read-write redirection to"
	case ops[0] == Read:
		return "input redirection from"
	}
	return "output redirection to"
}

// redirects checks the files a statement's redirections open.
func (c *checker) redirects(rs []*syntax.Redirect) error {
	for _, r := range rs {
		if err := c.redirect(r); err != nil {
			return err
		}
	}
	return nil
}

// redirect checks one redirection.
func (c *checker) redirect(r *syntax.Redirect) error {
	ops := redirOps(r.Op)
	if ops == nil || r.Word == nil {
		return nil
	}
	if len(r.Word.Parts) == 1 {
		if _, ok := r.Word.Parts[0].(*syntax.ProcSubst); ok {
			return nil // a pipe to or from the commands in it, checked as they are
		}
	}
	ws, err := c.words([]*syntax.Word{r.Word})
	if err != nil {
		return err
	}
	known := len(ws) == 1 && ws[0].literal()
	switch {
	case known && (r.Op == syntax.DplIn || r.Op == syntax.DplOut) && isDescriptor(ws[0].text):
		return nil
	case r.Op == syntax.DplIn && !known && c.lang != langMksh:
		// bash and the POSIX shells take the word of <& for a descriptor
		// and fail on anything else; they never open a file there. A
		// literal file name is checked all the same, for other shells.
		return nil
	}
	what, src := redirWhat(ops), shown(c.text(r.Word))
	for _, w := range ws {
		if mayBeNetwork(w.text) && w.literal() {
			return c.refuse("%s %s: bash opens /dev/tcp and /dev/udp as network connections, which a restricted policy does not allow", what, src)
		}
		if mayBeNetwork(w.text) {
			return c.refuse("%s %s: it is only known when the line runs and could name /dev/tcp or /dev/udp, which bash opens as network connections; write the path out (a literal start such as ./ or /tmp/ is enough)", what, src)
		}
	}
	if known && c.specialFile(ws[0].text) != notSpecial {
		return c.special(ws[0].text, ops)
	}
	if c.elsewhere {
		return c.refuse("%s %s: the command runs under another root directory or on another host, where the path rules cannot place the file", what, src)
	}
	c.line.opens(ops, src)
	// "~" is where $HOME points when the line runs, which the line itself
	// may change.
	if !known || ws[0].tilde {
		if c.p.hasPathRules(ops) {
			return c.refuse("%s %s: which file it opens is only known when the line runs, so the path rules cannot check it; write an absolute path", what, src)
		}
		if !known || ws[0].text != "~" && !strings.HasPrefix(ws[0].text, "~/") {
			return nil
		}
	}
	return c.target(ws[0], ops, what)
}

// mayBeNetwork reports whether a redirection target, dyn standing for
// what is only known at run time, may name what bash opens as a network
// connection: /dev/tcp/HOST/PORT or /dev/udp/HOST/PORT.
func mayBeNetwork(t string) bool {
	known, _, dynamic := strings.Cut(t, string(dyn))
	for _, dev := range []string{"/dev/tcp/", "/dev/udp/"} {
		if strings.HasPrefix(known, dev) || dynamic && strings.HasPrefix(dev, known) {
			return true
		}
		// Not what bash itself opens, but refused all the same.
		if !dynamic && strings.HasPrefix(path.Clean(t)+"/", dev) {
			return true
		}
	}
	return false
}

// specialKind sorts the literal targets that are not files the path rules
// place.
type specialKind int

const (
	notSpecial specialKind = iota
	// device is a device any command may use: /dev/null and the like.
	device
	// reopen names a descriptor of the shell: opening it opens again the
	// file that descriptor has open, for what the redirection does.
	reopen
)

// specialFile sorts the literal target t, as the checker's file system
// names it: where names are compared without case (Env.FoldCase),
// /DEV/FD/3 is /dev/fd/3.
func (c *checker) specialFile(t string) specialKind {
	if c.p.env.FoldCase && !isASCII(t) || c.p.env.FoldCase && strings.ToLower(t) != t {
		if k := specialFile(strings.ToLower(FoldName(t))); k != notSpecial {
			return k
		}
	}
	return specialFile(t)
}

// specialFile sorts the literal target t.
func specialFile(t string) specialKind {
	switch t {
	case "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty":
		return device
	case "/dev/stdin", "/dev/stdout", "/dev/stderr":
		return reopen
	}
	if n, ok := strings.CutPrefix(t, "/dev/fd/"); ok && n != "" && strings.Trim(n, "0123456789") == "" {
		return reopen
	}
	return notSpecial
}

// special notes a redirection to a device or a descriptor of the shell.
func (c *checker) special(t string, ops []Op) error {
	if c.specialFile(t) != reopen {
		return nil
	}
	for _, op := range ops {
		if c.line.reopened[op] == "" {
			c.line.reopened[op] = t
		}
	}
	return nil
}

// target checks one literal redirection target that names a file.
func (c *checker) target(w shWord, ops []Op, what string) error {
	t := w.text
	switch {
	case w.tilde:
		if c.p.env.Home == "" {
			return c.refuse("%s %s: the agent's user has no home directory to expand ~ to", what, shown(w.src))
		}
		t = c.p.env.Home + t[1:]
	case !strings.HasPrefix(t, "/"):
		c.line.relative = append(c.line.relative, relTarget{w, ops, what})
		return nil
	}
	return c.line.check(t, ops, what, w.src)
}

// check asks the line's FileCheck about path, opened for ops by a
// redirection (what src), and says so in its refusal.
func (l *lineState) check(path string, ops []Op, what, src string) error {
	err := l.files(path, ops...)
	var d *Denial
	if errors.As(err, &d) {
		return &Denial{d.Rule, fmt.Sprintf("%s %s: %s", what, shown(src), d.Reason)}
	}
	return err
}

// relTarget is a relative redirection target, checked once the whole line
// is known.
type relTarget struct {
	w    shWord
	ops  []Op
	what string
}

// opens notes that the line opens a file (or what may be one) for ops.
// Opened for reading and writing, a descriptor on it may be reopened
// either way.
func (l *lineState) opens(ops []Op, src string) {
	if len(ops) == 1 && l.only[ops[0]] == "" {
		l.only[ops[0]] = src
	}
}

// finish checks what could only be checked once the whole line is known:
// its relative redirection targets, and its descriptors reopened.
func (c *checker) finish() error {
	for _, rt := range c.line.relative {
		if c.line.cd {
			return c.refuse("%s %s in a line that changes directory: which file it opens cannot be known; use an absolute path", rt.what, shown(rt.w.src))
		}
		if err := c.line.check(strings.TrimSuffix(c.line.cwd, "/")+"/"+rt.w.text, rt.ops, rt.what, rt.w.src); err != nil {
			return err
		}
	}
	// A descriptor opened for reading only, then reopened for writing
	// through /dev/fd/N (or /dev/stdout, ...), opens its file again for
	// writing: the write rules never saw it. Likewise the other way.
	for op, other := range [2]Op{Read: Write, Write: Read} {
		dev, file := c.line.reopened[op], c.line.only[other]
		if dev != "" && file != "" {
			return c.refuse("%s reopens a descriptor of the shell for %s, and the line opens %s for %s only: that file could be reopened without the %s rules seeing it; duplicate descriptors with >&N or <&N instead", shown(dev), ing(Op(op)), file, ing(other), Op(op))
		}
	}
	return nil
}

// mayChangeDir reports, for a line checked for its redirections only,
// whether the command words may change the shell's directory: cd, pushd
// and popd wherever they appear in the words (builtin cd, command cd, a
// trap or an alias that runs cd), what runs text (eval, source, .), a
// command named only when the line runs, and the builtins that run their
// arguments given one only known then.
func mayChangeDir(words []shWord) bool {
	if !words[0].literal() {
		return true
	}
	runsArgs := false
	switch path.Base(words[0].text) {
	case ".", "builtin", "command", "eval", "trap", "alias", "source", "exec":
		runsArgs = true
	}
	for _, w := range words {
		if !w.literal() && runsArgs {
			return true
		}
		fields := strings.FieldsFunc(w.text, func(r rune) bool {
			return r != '_' && r != '.' && r != '-' && !unicode.IsLetter(r) && !unicode.IsDigit(r)
		})
		for _, f := range fields {
			switch f {
			case "cd", "pushd", "popd", "eval", "source":
				return true
			}
		}
	}
	return path.Base(words[0].text) == "."
}

// ing is op's verb in its -ing form, for messages.
func ing(op Op) string {
	if op == Write {
		return "writing"
	}
	return "reading"
}
