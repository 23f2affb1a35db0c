package policy

import (
	"strings"
)

// builtin checks the builtins that set variables (read, printf -v,
// mapfile, unset, declare, ...) or read them by a name bash evaluates
// (test -v), and those that change what a command name runs (hash -p,
// enable -f). Their words have been matched against the rules already.
func (c *checker) builtin(name string, words []shWord) error {
	args := words[1:]
	switch name {
	case "declare", "typeset", "local", "export", "readonly", "nameref":
		return c.declares(words)
	case "read", "mapfile", "readarray", "wait", "unset":
		return c.setsNamed(name, args)
	case "printf":
		return c.printfTarget(args)
	case "getopts":
		if len(args) < 2 {
			return nil
		}
		return c.setsVar(name, args[1], args[1].text, false)
	case "test", "[":
		return c.testNames(args)
	case "let":
		return c.letArgs(args)
	case "hash", "enable":
		return c.loads(name, args)
	}
	return nil
}

// setsNamed checks the variables read, mapfile, wait -p and unset set.
func (c *checker) setsNamed(name string, args []shWord) error {
	var spec optSpec
	switch name {
	case "read":
		spec = optSpec{flags: "ers", valued: "adinNptu"}
	case "mapfile", "readarray":
		spec = optSpec{flags: "t", valued: "dnOsuCc"}
	case "wait":
		spec = optSpec{flags: "fn", valued: "p"}
	case "unset":
		spec = optSpec{flags: "fvn"}
	}
	p, err := c.parseOpts(name, args, spec)
	if err != nil {
		return err
	}
	var names []shWord
	switch name {
	case "read":
		names = append(p.values("a", ""), p.rest...)
	case "mapfile", "readarray":
		names = p.rest[:min(len(p.rest), 1)]
	case "wait":
		names = p.values("p", "")
	case "unset":
		if p.has("f", "") {
			return nil // functions
		}
		names = p.rest
	}
	for _, w := range names {
		if err := c.setsVar(name, w, w.text, false); err != nil {
			return err
		}
	}
	return nil
}

// printfTarget checks the variables of printf -v NAME; the last -v wins.
// A word only known at run time where an option may be could be
// "-vNAME".
func (c *checker) printfTarget(args []shWord) error {
	for i := 0; i < len(args); i++ {
		w := args[i]
		known, _, _ := strings.Cut(w.text, string(dyn))
		switch {
		case !w.literal() && (strings.HasPrefix("-v", known) || strings.HasPrefix(known, "-v")):
			return c.refuse("printf %s: the word is only known when the line runs and may be -v NAME, which sets a variable; write the format out", shown(w.src))
		case w.text == "--" || !strings.HasPrefix(w.text, "-"):
			return nil
		case w.text == "-v" && i+1 < len(args):
			i++
			if err := c.setsVar("printf -v", args[i], args[i].text, false); err != nil {
				return err
			}
		case strings.HasPrefix(w.text, "-v"):
			if err := c.setsVar("printf", w, w.text[2:], false); err != nil {
				return err
			}
		}
	}
	return nil
}

// testNames checks, under an allow list, the names test -v and -R look up:
// bash evaluates a subscript in them as arithmetic. A word only known at
// run time may be -v.
func (c *checker) testNames(args []shWord) error {
	if !c.allowList() {
		return nil
	}
	for i := 1; i < len(args); i++ {
		prev, w := args[i-1], args[i]
		if prev.text != "-v" && prev.text != "-R" && prev.literal() {
			continue
		}
		if !w.literal() {
			return c.refuse("test %s %s: the variable it looks up is only known when the line runs, and bash evaluates a subscript in it as arithmetic", shown(prev.src), shown(w.src))
		}
		if err := c.setsVar("test -v", w, w.text, true); err != nil {
			return err
		}
	}
	return nil
}

// letArgs checks let's expressions: under an allow list they must be
// made of literal numbers; always, they may not assign variables that
// steer the shell.
func (c *checker) letArgs(args []shWord) error {
	for _, a := range args {
		if c.allowList() && !arithText(a.text) {
			return c.refuse("let %s cannot be checked: arithmetic on variables (bash evaluates a variable's value as code); under bash.allow arithmetic takes literal numbers only", shown(a.src))
		}
		for _, name := range identifiers(a.text) {
			if c.steers(name) {
				return c.refuse("let %s: setting %s changes what commands run, which the rules cannot follow", shown(a.src), name)
			}
		}
	}
	return nil
}

// identifiers returns the variable names in arithmetic text.
func identifiers(s string) []string {
	var ids []string
	for i := 0; i < len(s); {
		if !nameByte(s[i]) {
			i++
			continue
		}
		j := i
		for j < len(s) && nameByte(s[j]) {
			j++
		}
		if s[i] < '0' || s[i] > '9' {
			ids = append(ids, s[i:j])
		}
		i = j
	}
	return ids
}

func nameByte(b byte) bool {
	return b == '_' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z'
}

// loads refuses hash -p, which makes a command name run the program at a
// path, and enable -f, which loads a builtin from a shared object.
func (c *checker) loads(name string, args []shWord) error {
	opt := "p"
	if name == "enable" {
		opt = "f"
	}
	for _, a := range args {
		switch {
		case a.text == "--" || a.literal() && !strings.HasPrefix(a.text, "-"):
			return nil
		case !a.literal() || strings.Contains(a.text[1:], opt):
			return c.refuse("%s %s: it makes a command run code from a file the rules cannot see", name, shown(joinSrc(append([]shWord{{src: name}}, args...))))
		}
	}
	return nil
}
